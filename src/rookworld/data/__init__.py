"""Training and evaluation data: samples, sources (embedded, local files, hub datasets), splits,
the P:A sampler and the generator (`rookworld data ...`)."""

from rookworld.data.batches import SampleFilter, TaskSampler
from rookworld.data.record import Sample
from rookworld.data.sources import EMBEDDED, LoadReport, SampleSet, load_source

__all__ = ["EMBEDDED", "LoadReport", "Sample", "SampleFilter", "SampleSet", "TaskSampler", "load_source"]
