"""Every code block of README.md and of the documentation site's pages (docs/, in mkdocs.yml's nav order) runs as
written, or says in a comment why the tests cannot run it (issue 32, issue 49): the docs cannot drift from the code
again.

The blocks are read with a CommonMark parser and taken in order, README.md first, then the pages, as a new user
would, in one terminal:

* a block with a comment line ``# not run by the tests: <why>`` (``-- ...`` in SQL) is skipped, and the reason is
  printed; ``text`` blocks are output shown, not code. Any other block must run: a ``bash``, ``python`` or
  ``sql`` block without that comment is run, and a block in another language fails the test.
* ``bash`` blocks run in ``bash -e -o pipefail``. What a block exports is kept for the blocks after it (so
  ``. .venv/bin/activate`` and ``eval "$(make -s local-namespaces)"`` of "Trying the examples" set up the rest:
  the two local namespaces run as child processes, started by the README's own command, and are stopped at the
  end with ``make local-namespaces-stop``). The terminal starts without the venv on its PATH, without ``SB_*`` or
  ``REQUESTS_CA_BUNDLE``, and with ``LOCAL_NS_DIR``, ``LOCAL_NS_TLS_DIR`` and ``LOCAL_NS_PORTS=0 0`` (the
  Makefile's variables: this test's folders and free ports instead of /tmp/spark-sb-local, ~/.cache and 5672/5682).
* A line ``--8<-- "examples/<name>.py"`` in a block (pymdownx.snippets, how a page includes an example) is that
  file's text: the block is the example, as the site shows it.
* A ``python`` block whose first line names a file (``# orders.py: ...``) is saved as that file; a later block of
  its section must run it (the spark-submit example runs it, for real, with its own JVM). One that names an example
  (``# examples/orders_to_servicebus.py: ...``) must be that file's text (the README's copy); it is run where a
  later block of its section runs it, else in this process like any other python block.
* A ``bash`` block identical to one that ran before (the README's example and the installing page's) is not run
  twice.
* Other ``python`` blocks run in this process, in the session's SparkSession, with these names defined (what the
  README calls "your" DataFrame and so on; a block may define its own): ``spark``; ``df``, a streaming DataFrame
  of three JSON orders (``body``, ``message_id``); ``config``, ``load_config("conf/local.yaml")``; ``ckpt``, a
  fresh checkpoint folder. The three variables the terminal exported are set in ``os.environ`` and in the
  SparkContext's ``environment`` (what Python workers started from now on get, as a driver started in that
  terminal would). ``spark.stop()`` does nothing (the session is the test run's), and ``awaitTermination()``
  without a timeout processes what is there and stops the query (the test's stream never ends by itself).
  Queries a block started are drained and stopped after it and must not have failed.
* ``sql`` blocks run statement by statement with ``spark.sql``.

Each section of a file runs in a folder of its own that looks like a fresh clone (every top-level entry of the
repository linked, ``conf/`` copied) and stands for ``/tmp`` too: ``/tmp/`` in a block and in ``conf/*.yaml`` is
that folder's ``tmp/`` (the state tables of ``conf/local.yaml``, the examples' input and checkpoints). So the
examples of a section build on each other, never on another section's, and none writes to /tmp. A block that
sends (a stream, a batch write, ``sender.send``, or runs a saved file that does) must add messages to the
primary's ``orders`` queue.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

markdown_it = pytest.importorskip("markdown_it")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
NOT_RUN = re.compile(r"^\s*(?:#|--)\s*not run by the tests:\s*(?P<why>\S.*)$", re.M)
SAVED_FILE = re.compile(r"\A# (?P<name>(?:examples/)?[\w.-]+\.py): ")
#: A snippet include (pymdownx.snippets) on a line of its own: the file's text goes there.
SNIPPET = re.compile(r'^[ \t]*--8<--[ \t]+"(?P<path>[^"]+)"[ \t]*$', re.M)
RUN = {"bash", "python", "sql"}
OUTPUT = {"text"}
#: What a block that sends contains (or the file it runs contains).
SENDS = ("writeStream", ".save()", ".send(")
#: The variables "Trying the examples" exports and the examples read.
EXPORTED = ("REQUESTS_CA_BUNDLE", "SB_PRIMARY_CONNECTION_STRING", "SB_SECONDARY_CONNECTION_STRING")
#: Not linked into a section's folder: copied (conf) or nothing a clone has.
NOT_LINKED = {"conf", ".git", "spark-warehouse", "metastore_db", "derby.log"}
#: Set in this process by the session fixture's build_spark_session: not in a user's terminal.
SESSION_ENV = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYARROW_IGNORE_TIMEZONE", "SPARK_LOCAL_IP")
BASH_TIMEOUT = 900  # seconds; the spark-submit example takes 0.5-2.5 minutes on a loaded 2-core machine


def documents() -> list[Path]:
    """README.md, then the pages of mkdocs.yml's nav, in its order."""

    def files(node: Any) -> list[str]:
        if isinstance(node, str):
            return [node] if node.endswith(".md") else []
        values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
        return [f for value in values for f in files(value)]

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [README, *(ROOT / "docs" / page for page in files(nav))]


def expand_snippets(text: str) -> tuple[str, str | None]:
    """``text`` with each ``--8<-- "path"`` line replaced by that file's text; and the path, when the block is
    that one include and nothing else."""
    included = [m.group("path") for m in SNIPPET.finditer(text)]
    expanded = SNIPPET.sub(lambda m: (ROOT / m.group("path")).read_text().rstrip("\n"), text)
    only = included[0] if len(included) == 1 and not SNIPPET.sub("", text).strip() else None
    return expanded, only


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    section: str
    source: str = "README.md"  # the file, from the repository's root
    included: str | None = None  # the example file the block is (a snippet include), if it is only that

    @property
    def name(self) -> str:
        return f"{self.source}:{self.line} ({self.lang}, {self.section})"

    @property
    def not_run_because(self) -> str | None:
        found = NOT_RUN.search(self.text)
        return found.group("why").strip() if found else None

    @property
    def saved_as(self) -> str | None:
        found = SAVED_FILE.match(self.text) if self.lang == "python" else None
        return found.group("name") if found else None


def readme_blocks(markdown: str, source: str = "README.md") -> list[Block]:
    """The fenced code blocks of ``markdown``, in order, each with the heading it is under (snippets expanded)."""
    tokens = markdown_it.MarkdownIt("commonmark").parse(markdown)
    blocks, section = [], ""
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            section = tokens[i + 1].content
        elif token.type == "fence":
            lang = token.info.split()[0] if token.info.strip() else ""
            text, included = expand_snippets(token.content)
            blocks.append(Block(token.map[0] + 1, lang, text, section, source, included))
    return blocks


def all_blocks() -> list[Block]:
    """The blocks of README.md and of every page, in reading order."""
    return [
        b for path in documents() for b in readme_blocks(path.read_text(), path.relative_to(ROOT).as_posix())
    ]


def run_later(blocks: list[Block], i: int) -> bool:
    """Whether a later block of block ``i``'s file and section runs the file it names."""
    block = blocks[i]
    return any(
        b.source == block.source and b.section == block.section and block.saved_as in b.text
        for b in blocks[i + 1 :]
    )


def describe(exc: BaseException) -> str:
    """The error, with the lines of the block it came from (a Python block's traceback), shortened."""
    sources = {str(p) for p in documents()} | {str(p) for p in (ROOT / "examples").glob("*.py")}
    frames = [
        f"  {Path(frame.filename).relative_to(ROOT)} line {frame.lineno}: {frame.line}"
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename in sources
    ]
    text = "\n".join([f"{type(exc).__name__}: {exc}", *frames])
    return text if len(text) <= 8000 else text[:8000] + " ..."


def test_blocks_are_read_in_order_with_their_section_reason_and_file() -> None:
    markdown = """# Title
## First
```bash
echo one
```
```text
output
```
### Second
```python
# orders.py: a job
print(1)
```
  ```sql
  -- not run by the tests: needs a catalog
  SELECT 1
  ```
```yaml
a: 1
```
"""
    blocks = readme_blocks(markdown)
    assert [(b.line, b.lang, b.section) for b in blocks] == [
        (3, "bash", "First"),
        (6, "text", "First"),
        (10, "python", "Second"),
        (14, "sql", "Second"),
        (18, "yaml", "Second"),
    ]
    assert [b.not_run_because for b in blocks] == [None, None, None, "needs a catalog", None]
    assert [b.saved_as for b in blocks] == [None, None, "orders.py", None, None]
    assert (
        blocks[3].text == "-- not run by the tests: needs a catalog\nSELECT 1\n"
    )  # the list's indent removed


def test_a_page_includes_an_example_which_runs_where_a_later_block_of_its_section_runs_it() -> None:
    example = "examples/orders_to_servicebus.py"
    markdown = f"""# Page
## Job
```python
--8<-- "{example}"
```
```bash
spark-submit {example} conf/local.yaml
```
## Alone
```python
--8<-- "examples/without_spark.py"
```
## Other
```bash
spark-submit {example}
```
"""
    blocks = readme_blocks(markdown, "docs/page.md")
    assert [(b.source, b.section, b.included) for b in blocks] == [
        ("docs/page.md", "Job", example),
        ("docs/page.md", "Job", None),
        ("docs/page.md", "Alone", "examples/without_spark.py"),
        ("docs/page.md", "Other", None),
    ]
    assert blocks[0].text == (ROOT / example).read_text()  # the file's text, as the site shows it
    assert blocks[0].saved_as == example and blocks[2].saved_as == "examples/without_spark.py"
    assert [run_later(blocks, 0), run_later(blocks, 2)] == [True, False]  # saved, then run; run in place
    assert blocks[0].name == "docs/page.md:3 (python, Job)"


def test_the_pages_are_read_after_the_readme_in_the_navs_order() -> None:
    found = [p.relative_to(ROOT).as_posix() for p in documents()]
    assert found[:3] == ["README.md", "docs/index.md", "docs/installing.md"]
    assert set(found[1:]) == {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}


# about 2.5 minutes alone (4 on a 2-core machine busy with other Spark runs): the 300 s default is too tight
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_readme_code_block_runs_or_says_why_not(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = all_blocks()
    assert {b.source for b in blocks} > {"README.md"}, "no page of docs/ has a code block"
    undecided = [b.name for b in blocks if b.lang not in RUN | OUTPUT and b.not_run_because is None]
    assert not undecided, (
        f"code blocks in a language this test cannot run and without '# not run by the tests: <why>': {undecided}"
    )
    terminal = Terminal(spark, tmp_path, monkeypatch)
    report: list[str] = []
    failures: list[str] = []
    try:
        for i, block in enumerate(blocks):
            why = block.not_run_because
            if block.lang in OUTPUT:
                report.append(f"{block.name}: output, not code")
                continue
            if why is not None:
                report.append(f"{block.name}: not run: {why}")
                continue
            started = time.monotonic()
            save = block.saved_as is not None and (
                not block.saved_as.startswith("examples/") or run_later(blocks, i)
            )
            try:
                note = terminal.run(block, save=save)
            except Exception as exc:  # every block gets its turn; each failure is reported
                failures.append(f"{block.name}: {describe(exc)}")
                report.append(f"{block.name}: FAILED")
            else:
                took = f"ran in {time.monotonic() - started:.1f} s"
                report.append(f"{block.name}: {note or (f'saved as {block.saved_as}' if save else took)}")
        failures += terminal.saved_files_never_run()
    finally:
        failures += terminal.close()
        print("\n".join(["README and docs code blocks:", *report]))  # shown with -s or -rP
    assert not failures, "\n\n".join(failures)


class Terminal:
    """One user's terminal going through the README and the pages: the exported environment, a fresh clone per
    section, the SparkSession for Python blocks."""

    def __init__(self, spark: Any, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.spark = spark
        self.tmp = tmp
        self.monkeypatch = monkeypatch
        venv = str(ROOT / ".venv")
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not p.startswith(venv)]
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SB_", "MAKE", "MFLAGS", "PYTEST_"))
            and k not in (*EXPORTED, *SESSION_ENV, "VIRTUAL_ENV")
        }
        self.env.update(
            PATH=os.pathsep.join(path),
            LOCAL_NS_DIR=str(tmp / "local-namespaces"),
            LOCAL_NS_TLS_DIR=str(tmp / "tls"),
            LOCAL_NS_PORTS="0 0",
        )
        self.sections: dict[tuple[str, str], Path] = {}
        self.ran_bash: dict[str, str] = {}  # a bash block's text -> the block that ran it
        self.saved: dict[str, tuple[Block, Path]] = {}  # file name -> the block saved, where
        self.ran_saved: set[str] = set()
        self.spark_env_before = dict(spark.sparkContext.environment)

    # ------------------------------------------------------------------------------------------------ setup
    def folder(self, source: str, section: str) -> Path:
        """The section's fresh clone: every top-level entry of the repository linked, conf/ copied with /tmp/
        pointing into it."""
        if (source, section) in self.sections:
            return self.sections[(source, section)]
        slug = re.sub(r"[^\w]+", "-", f"{source.removesuffix('.md')} {section}").strip("-").lower()
        folder = self.tmp / "sections" / slug
        folder.mkdir(parents=True)
        for entry in ROOT.iterdir():
            if entry.name not in NOT_LINKED:
                (folder / entry.name).symlink_to(entry)
        (folder / "conf").mkdir()
        for conf in (ROOT / "conf").iterdir():
            (folder / "conf" / conf.name).write_text(self.rewrite(conf.read_text(), folder))
        (folder / "tmp").mkdir()
        self.sections[(source, section)] = folder
        return folder

    @staticmethod
    def rewrite(text: str, folder: Path) -> str:
        return text.replace("/tmp/", f"{folder}/tmp/")

    # ------------------------------------------------------------------------------------------------ blocks
    def run(self, block: Block, *, save: bool) -> str | None:
        """Runs ``block`` (or, with ``save``, saves the file it names); returns a note when it did neither."""
        folder = self.folder(block.source, block.section)
        text = self.rewrite(block.text, folder)
        name = block.saved_as
        if name is not None and name.startswith("examples/"):
            assert block.text == (ROOT / name).read_text(), (
                f"it is not {name} as that file is now: copy it here"
            )
        if name is not None and save:
            if not name.startswith("examples/"):  # an example is in the section's clone already
                (folder / name).write_text(text)
            self.saved[name] = (block, folder)
            return None
        if block.lang == "bash" and block.text in self.ran_bash:
            for saved, (_, where) in self.saved.items():
                if where == folder and saved in block.text:
                    self.ran_saved.add(saved)
            return f"not run twice: the same as {self.ran_bash[block.text]}, which ran"
        sends = any(s in block.text for s in SENDS) or any(
            name in block.text and any(s in saved.text for s in SENDS)
            for name, (saved, _) in self.saved.items()
        )
        before = self.orders_in_primary() if sends else 0
        for name, (_, where) in self.saved.items():
            if where == folder and name in block.text:
                self.ran_saved.add(name)
        if block.lang == "bash":
            self.run_bash(block, text, folder)
            self.ran_bash[block.text] = block.name
        elif block.lang == "python":
            self.run_python(block, text, folder)
        else:
            self.run_sql(text)
        if sends:
            after = self.orders_in_primary()
            assert after > before, (
                f"it sends, but the primary's queue 'orders' holds {after} messages, as before"
            )
        return None

    def run_bash(self, block: Block, text: str, folder: Path) -> None:
        exported = folder / f".env-{block.line}"
        script = folder / f".block-{block.line}.sh"
        script.write_text(f"{text}\nenv -0 > {shlex.quote(str(exported))}\n")
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", str(script)],
            cwd=folder,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its children (spark-submit's JVM) go with it on a timeout
        )
        try:
            stdout, stderr = proc.communicate(timeout=BASH_TIMEOUT)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if proc.returncode != 0:
            raise AssertionError(
                f"exit status {proc.returncode}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-6000:]}"
            )
        self.env = dict(item.split("=", 1) for item in exported.read_text().split("\0") if "=" in item)
        print(f"--- {block.name}\n{stdout[-2000:]}")

    def run_python(self, block: Block, text: str, folder: Path) -> None:
        from pyspark.sql.streaming.query import StreamingQuery
        from pyspark.sql.streaming.readwriter import DataStreamWriter

        from spark_sb import load_config

        missing = [k for k in EXPORTED if k not in self.env]
        assert not missing, f"no block before it exported {missing} (README: 'Trying the examples')"
        for key in EXPORTED:
            self.monkeypatch.setenv(key, self.env[key])
            self.spark.sparkContext.environment[key] = self.env[key]
        self.monkeypatch.chdir(folder)
        started: list[Any] = []
        real_start = DataStreamWriter.start
        real_await = StreamingQuery.awaitTermination

        def start(writer: Any, *args: Any, **kwargs: Any) -> Any:
            query = real_start(writer, *args, **kwargs)
            started.append(query)
            return query

        def await_termination(query: Any, timeout: Any = None) -> Any:
            if timeout is not None:
                return real_await(query, timeout)
            query.processAllAvailable()
            query.stop()
            return None

        names = {
            "__name__": "__readme__",
            "spark": self.spark,
            "df": self.orders_stream(folder, block),
            "config": load_config("conf/local.yaml"),
            "ckpt": str(folder / "tmp" / f"chk-{block.line}"),
        }
        with self.monkeypatch.context() as patch:
            patch.setattr(DataStreamWriter, "start", start)
            patch.setattr(StreamingQuery, "awaitTermination", await_termination)
            patch.setattr(self.spark, "stop", lambda: None, raising=False)
            try:
                # the block's lines keep their line numbers in a traceback: the page's, or the example file's
                if block.included is not None:
                    code = compile(text, str(ROOT / block.included), "exec")
                else:
                    code = compile("\n" * block.line + text, str(ROOT / block.source), "exec")
                exec(code, names)
            finally:
                for query in started:
                    with contextlib.suppress(Exception):
                        if query.isActive:
                            query.processAllAvailable()
                    with contextlib.suppress(Exception):
                        query.stop()
        for query in started:
            assert query.exception() is None, (
                f"its query {query.name or query.id} failed: {query.exception()}"
            )

    def run_sql(self, text: str) -> None:
        for statement in (s.strip() for s in text.split(";")):
            if statement:
                self.spark.sql(statement).collect()

    # ------------------------------------------------------------------------------------------------ helpers
    def orders_stream(self, folder: Path, block: Block) -> Any:
        """Three orders as JSON lines, read as a stream (what the README calls ``df``)."""
        source = folder / "tmp" / f"df-{block.line}"
        source.mkdir(parents=True)
        (source / "orders.json").write_text(
            "".join(f'{{"body": "order {i}", "message_id": "readme-{block.line}-{i}"}}\n' for i in range(3))
        )
        return self.spark.readStream.schema("body STRING, message_id STRING").json(str(source))

    def orders_in_primary(self) -> int:
        from azure.servicebus.management import ServiceBusAdministrationClient

        missing = [k for k in EXPORTED if k not in self.env]
        assert not missing, f"no block before it exported {missing} (README: 'Trying the examples')"
        with ServiceBusAdministrationClient.from_connection_string(
            self.env["SB_PRIMARY_CONNECTION_STRING"], connection_verify=self.env["REQUESTS_CA_BUNDLE"]
        ) as admin:
            return int(admin.get_queue_runtime_properties("orders").active_message_count or 0)

    def saved_files_never_run(self) -> list[str]:
        return [
            f"{block.name}: saved as {name}, but no later block of its section runs it"
            for name, (block, _) in self.saved.items()
            if name not in self.ran_saved
        ]

    def close(self) -> list[str]:
        """Stop the local namespaces the README started (its make target, then by pid if need be); put the
        SparkContext's environment back. Returns what went wrong."""
        problems: list[str] = []
        context = self.spark.sparkContext
        context.environment.clear()
        context.environment.update(self.spark_env_before)
        pid_dir = Path(self.env["LOCAL_NS_DIR"])
        if not pid_dir.exists():
            return problems
        done = subprocess.run(
            ["make", "-s", "local-namespaces-stop"], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if done.returncode != 0:
            problems.append(f"make local-namespaces-stop: exit status {done.returncode}: {done.stderr}")
        for pid_file in pid_dir.glob("*.pid"):
            problems.append(f"make local-namespaces-stop left {pid_file.name}")
            with contextlib.suppress(ValueError, OSError):
                pid = int(pid_file.read_text())
                if b"servicebus_local" in Path(f"/proc/{pid}/cmdline").read_bytes():  # the one it started
                    os.kill(pid, signal.SIGKILL)
        return problems
