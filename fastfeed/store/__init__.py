"""The packed store: its on-disk format (`format`, a record's bytes: `record`), the reader (`Store`), what readers need of any store
(`source.RecordSource`), integrity checks (`verify`)."""

from .format import FORMAT_VERSION, FormatError, Manifest, RecordCorrupt, StoreChanged
from .reader import Sample, Store
from .record import Record
from .source import RecordSource

__all__ = ["Store", "Sample", "Record", "RecordSource", "Manifest", "FORMAT_VERSION", "FormatError", "RecordCorrupt",
           "StoreChanged"]
