"""BERT's WordPiece tokenizer on the tokenizers engine, with transformers' surface.

wordpiece.py is BertTokenizer (text -> ids, files); surface.py what transformers' users call on
it beyond encoding (role tokens, added tokens, ``pad``); encoding.py BatchEncoding, what a call
returns; vocab.py vocabulary files and ``train_vocab``. It imports only the leaves.
"""

from bertlab.tokenizer.encoding import BatchEncoding
from bertlab.tokenizer.vocab import SPECIAL_TOKENS, read_vocab, train_vocab
from bertlab.tokenizer.wordpiece import BertTokenizer

__all__ = ["SPECIAL_TOKENS", "BatchEncoding", "BertTokenizer", "read_vocab", "train_vocab"]
