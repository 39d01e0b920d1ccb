"""Placeholder until the TensorFlow checkpoint reader lands."""


def is_tf_checkpoint(folder) -> bool:
    return False


def read_tf_checkpoint(folder):
    raise NotImplementedError
