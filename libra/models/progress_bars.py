"""transformers' progress bars: shown to a person at a terminal, kept out of logs.

Reading a GGUF checkpoint draws two bars: transformers' "Loading weights" (its own
switch, ``transformers.utils.logging.disable_progress_bar``, off from the start when
``HF_HUB_DISABLE_PROGRESS_BARS`` is set) and the GGUF converter's "Converting and
de-quantizing GGUF tensors" (a plain ``tqdm`` that no switch reaches). Written to a file
or a pipe, as in CI, each redraw is one more line of the log (about twenty for
SmolLM2); at a terminal they show that a minute-long import is moving. ``progress_bars``
turns both off for a block, and back to what they were after it.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator


def bars_wanted() -> bool:
    """Bars unless stderr is not a terminal or the user turned them off
    (``HF_HUB_DISABLE_PROGRESS_BARS=1``, read by transformers at import)."""
    from transformers.utils import logging as hf_logging

    return sys.stderr.isatty() and hf_logging.is_progress_bar_enabled()


@contextlib.contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """transformers' bars on (as they are) or off for the block."""
    if enabled:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_loader
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    converter_bar = getattr(gguf_loader, "tqdm", None)
    hf_logging.disable_progress_bar()
    if converter_bar is not None:  # the converter's module-level tqdm, made silent
        gguf_loader.tqdm = functools.partial(converter_bar, disable=True)
    try:
        yield
    finally:
        if converter_bar is not None:
            gguf_loader.tqdm = converter_bar
        if was_enabled:
            hf_logging.enable_progress_bar()
