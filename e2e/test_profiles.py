"""Where a profile's time went: shares by library, by function, and by this repository's functions."""

import sysconfig

from e2e.kubelet.images import REPO_ROOT
from e2e.profiles import Summary, library

STDLIB = sysconfig.get_paths()["stdlib"]
SITE = sysconfig.get_paths()["purelib"]


def test_samples_are_charged_to_the_running_frame_and_to_our_callers() -> None:
    loop = f"run_forever ({STDLIB}/asyncio/base_events.py)"
    worker = f"worker ({REPO_ROOT}/kube/workqueue.py)"
    reconcile = f"reconcile ({REPO_ROOT}/controller/dualpods/reconcile.py)"
    write = f"update ({REPO_ROOT}/controller/dualpods/writer.py)"
    decode = f"raw_decode ({STDLIB}/json/decoder.py)"
    deserialize = f"deserialize ({SITE}/kubernetes_asyncio/client/api_client.py)"
    raw = (f"{loop};{worker};{reconcile};{decode} 6\n{loop};{worker};{write};{deserialize} 3\n{loop} 1\n"
           "not a stack line\n")  # fmt: skip
    summary = Summary.of(raw)
    assert summary.samples == 10
    assert summary.libraries == [("json", 0.6), ("kubernetes_asyncio", 0.3), ("asyncio", 0.1)]
    assert summary.own[0] == ("raw_decode (json/decoder.py)", 0.6)
    # The worker loop holds 90% of the samples: an entry point, left out.
    assert summary.ours == [("reconcile (controller/dualpods/reconcile.py)", 0.6),
                            ("update (controller/dualpods/writer.py)", 0.3)]  # fmt: skip


def test_library_names_a_file_by_what_it_belongs_to() -> None:
    assert library(f"{SITE}/aiohttp/client.py") == "aiohttp"
    assert library(f"{REPO_ROOT}/api/crds.py") == "api"
    assert library(f"{STDLIB}/copy.py") == "copy"
