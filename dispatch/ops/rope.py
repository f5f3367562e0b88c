"""Placeholder: being written (see the op family's issue)."""


def rope(*args, **kwargs):
    raise NotImplementedError("dispatch.rope is being written")
