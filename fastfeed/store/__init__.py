"""The packed store: its on-disk format (`format`), the reader (`Store`), integrity checks (`verify`)."""

from .format import FORMAT_VERSION, FormatError, Manifest, Record, RecordCorrupt
from .reader import Sample, Store

__all__ = ["Store", "Sample", "Record", "Manifest", "FORMAT_VERSION", "FormatError", "RecordCorrupt"]
