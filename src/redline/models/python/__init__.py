"""Python models: a version folder holding ``model.py`` in place of ``model.onnx``.

``model.py`` holds a class with ``load(self, folder)`` and ``predict(self, inputs) -> outputs``
(dicts of name -> numpy array, rows first) and its signature; the server runs it through the same
handle, batcher and budget as an ONNX model (``PythonSession`` is a ``ModelRunner``). The format
is documented in ``docs/models.md`` ("Python models").
"""

from redline.models.python.add import TRUST_WARNING, add_python
from redline.models.python.code import CLASS_NAME, ENTRY_FILE, parse_specs
from redline.models.python.session import SAMPLE_FILE, PythonSession, verify_files

__all__ = [
    "CLASS_NAME",
    "ENTRY_FILE",
    "SAMPLE_FILE",
    "TRUST_WARNING",
    "PythonSession",
    "add_python",
    "parse_specs",
    "verify_files",
]
