"""Reading a worker's log written during an outage (bench/outage.py and the outage test).

The settings' text format is `asctime levelname logger [pid] message`; a line that does not
start so (a traceback, a message's second line) belongs to the record above it.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

RECORD = re.compile(
    r"^(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+) (?P<logger>\S+) "
    r"\[(?P<pid>\d+)\] (?P<message>.*)$"
)
WINDOW_SECONDS = 30.0
# How project/quiet_log.py's closing lines read (QuietLog.recovered's messages).
RECOVERY_WORDS = ("working again", "renewed again", "connected again")


@dataclass
class Record:
    when: datetime
    level: str
    logger: str
    pid: int
    message: str
    more: list[str] = field(default_factory=list)

    @property
    def loop(self) -> str:
        """The loop a line speaks for: its logger, the process, and (for QuietLog's lines,
        "<loop>: ...") the loop's name."""
        name = self.message.split(": ", 1)[0] if ": " in self.message[:80] else ""
        return f"{self.logger}[{self.pid}] {name}".strip()

    @property
    def recovery(self) -> bool:
        return any(words in self.message for words in RECOVERY_WORDS)

    @property
    def traceback(self) -> bool:
        return any(line.startswith("Traceback (most recent call last)") for line in self.more)


class OutageLog:
    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.records: list[Record] = []
        self.stray = 0  # lines before the first record
        for line in self.lines:
            match = RECORD.match(line)
            if match:
                self.records.append(
                    Record(
                        when=datetime.strptime(match["when"], "%Y-%m-%d %H:%M:%S,%f"),
                        level=match["level"],
                        logger=match["logger"],
                        pid=int(match["pid"]),
                        message=match["message"],
                    )
                )
            elif self.records:
                self.records[-1].more.append(line)
            else:
                self.stray += 1

    @property
    def tracebacks(self) -> int:
        return sum(record.traceback for record in self.records)

    def per_loop(self) -> Counter[str]:
        return Counter(record.loop for record in self.records)

    def most_in_a_window(self, seconds: float = WINDOW_SECONDS) -> dict[str, int]:
        """Per loop, the most records it wrote within any `seconds`."""
        times: dict[str, list[datetime]] = defaultdict(list)
        for record in self.records:
            times[record.loop].append(record.when)
        most = {}
        for loop, stamps in times.items():
            best, start = 0, 0
            for end, stamp in enumerate(stamps):
                while (stamp - stamps[start]).total_seconds() >= seconds:
                    start += 1
                best = max(best, end - start + 1)
            most[loop] = best
        return most

    def matching(self, words: str) -> list[Record]:
        return [record for record in self.records if words in record.message]

    def table(self, *, minutes: float) -> str:
        """Figures of this stretch of log, `minutes` long."""
        minutes = max(minutes, 1e-9)
        most = self.most_in_a_window()
        rows = [
            f"log lines {len(self.lines)}, records {len(self.records)}, "
            f"tracebacks {self.tracebacks}",
            f"lines per minute {len(self.lines) / minutes:.1f}",
        ]
        if self.records:
            first = self.records[0].when
            per_minute = Counter(int((r.when - first).total_seconds() // 60) for r in self.records)
            rows.append(
                "records per minute: "
                + ", ".join(f"{m}:{per_minute[m]}" for m in range(max(per_minute) + 1))
            )
        rows.append(f"{'loop (logger[pid] name)':<70} {'records':>7} {'max/30s':>7}")
        for loop, count in self.per_loop().most_common():
            rows.append(f"{loop[:70]:<70} {count:>7} {most[loop]:>7}")
        recovered = [record for record in self.records if record.recovery]
        rows.append(f"recovery lines: {len(recovered)}")
        rows.extend(f"  {r.logger}[{r.pid}] {r.message[:110]}" for r in recovered[:12])
        return "\n".join(rows)
