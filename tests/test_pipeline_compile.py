"""``pipeline(..., compile=True)`` sends single texts and batches with little padding through
its ``Compiled`` program and the rest through the model, with the model's answers. The program
is stood in for by the model's own forward here (building one takes tens of seconds;
tests/test_compiled.py holds real programs to the model's results)."""

from dataclasses import replace

import torch

from bertlab import BertConfig, BertModel, BertTokenizer, pipeline
from bertlab.nn import cpu
from bertlab.nn.compiled import Compiled

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "gorgeous", "film", "dull", "and"]


def test_a_compiled_pipeline_runs_single_texts_compiled_and_answers_as_the_model(
    tmp_path, monkeypatch
):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=len(VOCAB),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=16,
        )
    ).eval()
    built = []

    def build(self, inputs):  # the program: the model's own forward, on the inputs it was given
        built.append(sorted(inputs))
        return lambda **kw: self.model(**kw)

    monkeypatch.setattr(Compiled, "_build", build)
    # the program whatever this CPU's class (where Compiled uses one is tests/test_cpu.py's)
    here = cpu.current()
    monkeypatch.setattr(
        cpu, "_CURRENT", [replace(here, compiled=frozenset({"float32"}), compiled_tokens={})]
    )
    tok = BertTokenizer(str(tmp_path / "vocab.txt"))
    compiled = pipeline("embed", model=model, tokenizer=tok, compile=True)
    plain = pipeline("embed", model=model, tokenizer=tok)
    assert isinstance(compiled.forward, Compiled)
    one = compiled("a gorgeous film")
    torch.testing.assert_close(one, plain("a gorgeous film"), rtol=1e-6, atol=1e-6)
    assert compiled.forward.calls == {"compiled": 1, "eager": 0} and len(built) == 1
    # a batch with much padding runs the model itself (packed), with the same answers
    texts = ["a", "a gorgeous film and a dull film and a gorgeous film"]
    got, want = compiled(texts), plain(texts)
    assert compiled.forward.calls["eager"] == 1
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
