"""docs/metrics.md lists exactly the metrics a live agent and aggregator export (name, type,
labels, meaning): the tables between the GENERATED markers are rendered from a live
scrape and must match (`python -m tests.unit.docs.test_metrics_doc` rewrites them)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from agent.metrics.ports import PORT_COUNTERS
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from tests.support.livemetrics import Scrapes, families, live_scrape
from tests.support.paths import REPO

DOC = REPO / "docs" / "metrics.md"
BEGIN, END = "<!-- BEGIN GENERATED", "<!-- END GENERATED -->"
SHOWN = {"counter": "{}_total", "histogram": "{}_bucket/_sum/_count", "gauge": "{}"}
SECTIONS = (("agent", "Agent (`nicfleet-agent run --metrics-addr HOST:PORT`)"),
            ("aggregator", "Aggregator (`/metrics` on the API listener)"))  # fmt: skip


def table(text: str, labels: dict[str, tuple[str, ...]]) -> list[str]:
    lines = ["| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
    for name, (kind, help_text, seen) in sorted(families(text).items()):
        names = labels.get(name) or seen
        shown = ", ".join(f"`{n}`" for n in names) or "—"
        meaning = help_text.replace("|", "\\|")
        lines.append(f"| `{SHOWN[kind].format(name)}` | {kind} | {shown} | {meaning} |")
    return lines


def render(scrapes: Scrapes) -> str:
    lines = [BEGIN + ": python -m tests.unit.docs.test_metrics_doc -->", ""]
    for attr, title in SECTIONS:
        lines += [f"### {title}", "", *table(getattr(scrapes, attr), scrapes.labels), ""]
    return "\n".join([*lines, END])


def generated_part(doc: str) -> str:
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[start:end]


async def test_the_doc_lists_exactly_the_exported_metrics(nats_server: NatsServer) -> None:
    scrapes = await live_scrape(nats_server.url)
    doc = DOC.read_text()
    assert generated_part(doc) == render(scrapes), (
        "regenerate: python -m tests.unit.docs.test_metrics_doc"
    )
    # Every family has a meaning; the fixed counter set is documented by name.
    for text in (scrapes.agent, scrapes.aggregator):
        assert all(help_text for _k, help_text, _l in families(text).values())
    hand_written = doc.replace(generated_part(doc), "")
    for qualified in PORT_COUNTERS:
        assert f"`{qualified.split('/')[1]}`" in hand_written, qualified


def test_the_doc_is_linked_from_the_readme() -> None:
    assert "docs/metrics.md" in (DOC.parents[1] / "README.md").read_text()


async def _rewrite() -> None:
    with (
        tempfile.TemporaryDirectory() as store,
        NatsServer(NatsServerSettings(store_dir=Path(store))) as server,
    ):
        scrapes = await live_scrape(server.url)
    doc = DOC.read_text()
    DOC.write_text(doc.replace(generated_part(doc), render(scrapes)))
    print(f"wrote {DOC}")


if __name__ == "__main__":
    asyncio.run(_rewrite())
