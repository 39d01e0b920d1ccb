"""The network: the configuration, the modules of the paper's figure, the task heads, the
attention kernels and the packed layout, and the performance modules chosen when a model is
built or moved. Imports nothing of bertlab outside this folder except ``bertlab.io`` (loading
and saving, imported where it is used)."""
