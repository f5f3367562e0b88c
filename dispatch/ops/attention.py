"""Placeholder: being written (see the op family's issue)."""


def attention(*args, **kwargs):
    raise NotImplementedError("dispatch.attention is being written")
