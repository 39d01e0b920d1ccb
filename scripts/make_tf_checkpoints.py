"""Write the small TensorFlow BERT checkpoints under tests/fixtures/tf/ with TensorFlow itself.

bertlab never imports TensorFlow; this script is the one place that does, and it runs in a
separate environment that bertlab does not depend on:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 numpy
    /tmp/tfvenv/bin/python scripts/make_tf_checkpoints.py

Each checkpoint has its variables named as Google's original BERT code names them
(``bert/embeddings/word_embeddings``, ``bert/encoder/layer_0/attention/self/query/kernel``,
``cls/predictions/output_bias`` ...), random values from a fixed seed, and is saved by
``tf.compat.v1.train.Saver`` in the V2 format (``.index`` + ``.data-*`` + ``.meta``), beside a
``bert_config.json`` and a tiny ``vocab.txt``. Next to it, ``expected.npz`` holds what a forward
pass of the original BERT equations, computed here in TensorFlow on the same variables, gives for
one small padded batch: the encoder output, the pooled output, the masked-LM and
next-sentence logits. The tests compare bertlab with those numbers.

The checkpoints:

``pretraining``: float32, 2 layers, hidden 32, 2 heads, feed-forward 64, 99 tokens; the
    pre-training heads (``cls/...``), and the optimiser's slots as the released checkpoints carry
    them (``<variable>/adam_m``, ``<variable>/adam_v``, ``global_step``).
``classifier_fp16_sharded``: float16, the same sizes, the data in two shards (variables placed on
    two CPU devices, ``Saver(sharded=True)``); the backbone and the sentence classifier that the
    original ``run_classifier.py`` adds (``output_weights``, ``output_bias``: variables bertlab
    does not map), ``global_step``, and no pre-training heads.

The GELU is the exact one, ``x * 0.5 * (1 + erf(x / sqrt(2)))``: the one the released
checkpoints were trained with and that ``"hidden_act": "gelu"`` means in a Hugging Face config.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1
OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tf"

CONFIG = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 99,
}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a an of to and in is was it that he she they we you i for on with as at by from this "
    "be are were have has had not but or all one two new first time year people way day man "
    "world life hand part child eye woman place work week case point number group fact"
).split()

# One small batch: the second row is padded, both rows have two segments.
INPUT_IDS = [[2, 10, 11, 12, 3, 13, 14, 3], [2, 20, 4, 21, 3, 22, 3, 0]]
TOKEN_TYPE_IDS = [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 1, 1, 0]]
ATTENTION_MASK = [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0]]


def vocab() -> list[str]:
    words = SPECIALS + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    words += [f"w{i}" for i in range(CONFIG["vocab_size"] - len(words))]
    assert len(words) == CONFIG["vocab_size"], len(words)
    return words


class Variables:
    """Creates the variables with random values (LayerNorm scales near 1, everything else far
    from BERT's initial values, so that a swapped or transposed weight shows)."""

    def __init__(self, rng: np.random.Generator, dtype: tf.DType):
        self.rng = rng
        self.dtype = dtype
        self.created: list[tf.Variable] = []

    def get(self, name: str, shape: tuple[int, ...], kind: str = "weight") -> tf.Variable:
        noise = self.rng.standard_normal(shape)
        value = {"scale": 1.0 + 0.2 * noise, "bias": 0.1 * noise, "weight": 0.2 * noise}[kind]
        var = tf1.get_variable(
            name, initializer=tf.constant(value, dtype=self.dtype.as_numpy_dtype), dtype=self.dtype
        )
        self.created.append(var)
        return var


def f32(x: tf.Tensor) -> tf.Tensor:
    return tf.cast(x, tf.float32)


def gelu(x: tf.Tensor) -> tf.Tensor:
    return x * 0.5 * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def dense(v: Variables, x: tf.Tensor, n_in: int, n_out: int, scope: str) -> tf.Tensor:
    """``x @ kernel + bias`` with kernel (n_in, n_out): the layout of tf.layers.dense."""
    with tf1.variable_scope(scope):
        kernel = v.get("kernel", (n_in, n_out))
        bias = v.get("bias", (n_out,), "bias")
    return tf.matmul(x, f32(kernel)) + f32(bias)


def layer_norm(v: Variables, x: tf.Tensor, n: int) -> tf.Tensor:
    with tf1.variable_scope("LayerNorm"):
        beta = v.get("beta", (n,), "bias")
        gamma = v.get("gamma", (n,), "scale")
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-12) * f32(gamma) + f32(beta)


def bert(v: Variables, ids, types, mask, devices: tuple[str, str] | None = None):
    """The original BERT equations on (B, T) inputs: returns the embedding table, (B, T, H) sequence
    output and (B, H) pooled output. Variables alternate between two devices when given."""
    c = CONFIG
    H, I, A = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    B, T = ids.shape
    d = H // A

    def device(i: int):
        return tf.device(devices[i % 2]) if devices else _nothing()

    with tf1.variable_scope("bert"):
        with tf1.variable_scope("embeddings"), device(0):
            table = v.get("word_embeddings", (c["vocab_size"], H))
            x = tf.gather(f32(table), ids)
            types_table = v.get("token_type_embeddings", (c["type_vocab_size"], H))
            x += tf.gather(f32(types_table), types)
            positions = v.get("position_embeddings", (c["max_position_embeddings"], H))
            x += f32(positions)[:T][None]
            x = layer_norm(v, x, H)
        # (B, 1, 1, T): -10000 where a key is padding, as the original code adds it.
        adder = (1.0 - tf.cast(mask, tf.float32))[:, None, None, :] * -10000.0
        with tf1.variable_scope("encoder"):
            for n in range(c["num_hidden_layers"]):
                with tf1.variable_scope(f"layer_{n}"), device(n + 1):
                    with tf1.variable_scope("attention"):
                        with tf1.variable_scope("self"):

                            def heads(t):  # (B, T, H) -> (B, A, T, d)
                                return tf.transpose(tf.reshape(t, (B, T, A, d)), (0, 2, 1, 3))

                            q = heads(dense(v, x, H, H, "query"))
                            k = heads(dense(v, x, H, H, "key"))
                            val = heads(dense(v, x, H, H, "value"))
                            scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(d) + adder
                            ctx = tf.matmul(tf.nn.softmax(scores, axis=-1), val)
                            ctx = tf.reshape(tf.transpose(ctx, (0, 2, 1, 3)), (B, T, H))
                        with tf1.variable_scope("output"):
                            x = layer_norm(v, dense(v, ctx, H, H, "dense") + x, H)
                    with tf1.variable_scope("intermediate"):
                        inner = gelu(dense(v, x, H, I, "dense"))
                    with tf1.variable_scope("output"):
                        x = layer_norm(v, dense(v, inner, I, H, "dense") + x, H)
        with tf1.variable_scope("pooler"), device(1):
            pooled = tf.tanh(dense(v, x[:, 0], H, H, "dense"))
    return table, x, pooled


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def pretraining_heads(v: Variables, table, seq, pooled):
    """The masked-LM logits (B, T, V) and next-sentence logits (B, 2)."""
    H, V = CONFIG["hidden_size"], CONFIG["vocab_size"]
    with tf1.variable_scope("cls/predictions"):
        with tf1.variable_scope("transform"):
            h = layer_norm(v, gelu(dense(v, seq, H, H, "dense")), H)
        output_bias = v.get("output_bias", (V,), "bias")
        mlm = tf.einsum("bth,vh->btv", h, f32(table)) + f32(output_bias)
    with tf1.variable_scope("cls/seq_relationship"):
        weights = v.get("output_weights", (2, H))  # (2, H): used as x @ weights^T
        bias = v.get("output_bias", (2,), "bias")
        nsp = tf.matmul(pooled, f32(weights), transpose_b=True) + f32(bias)
    return mlm, nsp


def adam_slots(v: Variables) -> None:
    """``<variable>/adam_m`` and ``/adam_v`` for every weight, as AdamWeightDecayOptimizer names
    them in the released checkpoints."""
    for var in list(v.created):
        name = var.op.name
        shape = tuple(var.shape.as_list())
        tf1.get_variable(name + "/adam_m", initializer=np.float32(v.rng.standard_normal(shape)))
        tf1.get_variable(name + "/adam_v", initializer=np.float32(v.rng.random(shape)))


def write(name: str, build, sharded: bool = False) -> None:
    folder = OUT / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf.constant(INPUT_IDS, tf.int32)
        types = tf.constant(TOKEN_TYPE_IDS, tf.int32)
        mask = tf.constant(ATTENTION_MASK, tf.int32)
        outputs, step_value = build(ids, types, mask)
        global_step = tf1.get_variable(
            "global_step", initializer=np.int64(step_value), trainable=False
        )
        saver = tf1.train.Saver(sharded=sharded, write_version=tf1.train.SaverDef.V2)
        config = tf1.ConfigProto(device_count={"CPU": 2})
        with tf1.Session(graph=graph, config=config) as sess:
            sess.run(tf1.global_variables_initializer())
            values = sess.run(outputs)
            values["global_step"] = sess.run(global_step)
            saver.save(sess, str(folder / "bert_model.ckpt"), write_meta_graph=False)
    (folder / "checkpoint").unlink(missing_ok=True)  # the "latest checkpoint" file: not needed
    (folder / "bert_config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    (folder / "vocab.txt").write_text("".join(w + "\n" for w in vocab()))
    np.savez(
        folder / "expected.npz",
        input_ids=np.array(INPUT_IDS, np.int64),
        token_type_ids=np.array(TOKEN_TYPE_IDS, np.int64),
        attention_mask=np.array(ATTENTION_MASK, np.int64),
        **{k: np.asarray(val) for k, val in values.items()},
    )
    print(f"wrote {folder}: {sorted(p.name for p in folder.iterdir())}")


def build_pretraining(ids, types, mask):
    v = Variables(np.random.default_rng(1), tf.float32)
    table, seq, pooled = bert(v, ids, types, mask)
    mlm, nsp = pretraining_heads(v, table, seq, pooled)
    adam_slots(v)
    outputs = dict(sequence_output=seq, pooled_output=pooled, mlm_logits=mlm, nsp_logits=nsp)
    return outputs, 1000


def build_classifier(ids, types, mask):
    v = Variables(np.random.default_rng(2), tf.float16)
    devices = ("/cpu:0", "/cpu:1")
    table, seq, pooled = bert(v, ids, types, mask, devices)
    with tf.device(devices[1]):
        weights = v.get("output_weights", (3, CONFIG["hidden_size"]))  # run_classifier.py's head
        bias = v.get("output_bias", (3,), "bias")
    logits = tf.matmul(pooled, f32(weights), transpose_b=True) + f32(bias)
    outputs = dict(sequence_output=seq, pooled_output=pooled, classifier_logits=logits)
    return outputs, 250


README = """# Original-format (TensorFlow) BERT checkpoints

Small checkpoints in the layout of Google's BERT releases (`bert_model.ckpt.index`,
`bert_model.ckpt.data-*`, `bert_config.json`, `vocab.txt`; the `.meta` graph is left out),
written by TensorFlow {tf_version} itself, for `tests/test_tf_checkpoint.py`.

- `pretraining/`: float32, 2 layers, hidden 32, 2 heads, feed-forward 64, 99 tokens; the
  pre-training heads (`cls/predictions/...`, `cls/seq_relationship/...`) and the optimiser
  state of the released checkpoints (`<variable>/adam_m`, `<variable>/adam_v`, `global_step`).
- `classifier_fp16_sharded/`: float16, the same sizes, its data in three shards (variables on
  two CPU devices, `Saver(sharded=True)`; `global_step` has a shard of its own); the backbone
  plus the classifier the original `run_classifier.py` adds (`output_weights`, `output_bias`,
  which bertlab does not map), no pre-training heads.

Each folder's `expected.npz` holds a small padded batch (`input_ids`, `token_type_ids`,
`attention_mask`) and what the original BERT equations, computed in TensorFlow on the same
variables, give for it: `sequence_output`, `pooled_output`, and `mlm_logits` + `nsp_logits`
(pre-training) or `classifier_logits`; and the saved `global_step`.

Variable values are random with fixed seeds (LayerNorm scales near 1, the rest far from BERT's
initial values so that a swapped or untransposed weight shows). To write them again, in a
separate environment (bertlab never depends on TensorFlow):

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu==2.21.0 numpy
    /tmp/tfvenv/bin/python scripts/make_tf_checkpoints.py
"""


def main() -> None:
    write("pretraining", build_pretraining)
    write("classifier_fp16_sharded", build_classifier, sharded=True)
    (OUT / "README.md").write_text(README.format(tf_version=tf.__version__))


if __name__ == "__main__":
    main()
