"""The packed store: its on-disk format (`format`), the reader (`Store`), integrity checks (`verify`)."""

from .format import FORMAT_VERSION, FormatError, RecordCorrupt
from .reader import Sample, Store

__all__ = ["Store", "Sample", "FORMAT_VERSION", "FormatError", "RecordCorrupt"]
