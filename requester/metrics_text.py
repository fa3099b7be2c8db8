"""Reading a model server's Prometheus `/metrics` text: the samples of one metric, by prometheus_client's parser.

Only that metric's own lines are handed to the parser: vLLM's exposition is long, and the overload rule
reads it several times a second while the server is busy.
"""

import functools
import logging
import re

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)


@functools.cache
def _lines_of(name: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(name)}(?:\{{.*\}})?[ \t].*$", re.MULTILINE)


def samples(metrics_text: str, name: str) -> list[Sample]:
    """The samples of metric `name`, one per label set; none when absent or unreadable."""
    lines = _lines_of(name).findall(metrics_text)
    if not lines:
        return []
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except ValueError as err:
        log.warning("cannot read the model server's %s: %s", name, err)
        return []
    return [sample for family in families for sample in family.samples if sample.name == name]
