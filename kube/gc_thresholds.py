"""The garbage collector's thresholds for a process that caches many API objects and replaces them as watch
events come: the controllers, and the loopback kubelet and simulation processes that play a cluster's Nodes.

CPython 3.11 collects its youngest generation every 700 new container objects, and the whole heap whenever a
quarter of the objects that survived young collections are new since the last full collection. A process
whose long-lived objects grow by hundreds of thousands (a cache filling as Pods come, the newer copy of an
object that each watch event brings) meets that quarter again and again: in `bench/scale.py`'s 1,000-requester
run the loopback kubelet spent 20 s of its 47 s of CPU in 26 full collections of 0.8 s each, and the
simulation processes about as large a share.

These objects hold no reference cycles (API objects are trees, freed by reference counting the moment a newer
copy replaces them or their Pod goes), so walking them finds nothing. The cycles the collector is for (an
exception and its traceback, a future and its callbacks) are short-lived and die young, so a young generation
of YOUNG objects still collects them, only less often; a full collection comes after OLD middle ones, each
after MIDDLE young ones (some minutes of a busy controller, not seconds). What is alive when the process has
started (its imports) is moved out of the collector's sight for good.
"""

import gc

YOUNG = 50_000
MIDDLE = 20
OLD = 10


def tune_for_caches() -> None:
    """Call once the process has imported what it needs, before it starts its work."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
