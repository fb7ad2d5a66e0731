"""Every fenced block of README.md and docs/*.md is a test (Sybil), so the docs cannot drift
from the code. What each kind of block must do, and how the Markdown marks the exceptions:

- ```` ```python ````: runs, the blocks of one document in order in one namespace, in a fresh
  temporary directory (the document's), as a reader runs them one after the other. Names a
  block only uses (your model, a data set) and tiny settings (few samples, one epoch) come
  from a hidden setup just before it, ``<!-- invisible-code-block: python ... -->``, which the
  rendered page does not show. The directory holds the guides' ``trace.csv``
  (examples/trace.csv).
- ``<!-- fragment: why -->`` before a Python block: an excerpt that cannot run alone (the
  text says so too); the test reports it skipped, with the why.
- ``<!-- skip: next "why" -->`` before a Python block that needs what this run lacks (an XLA
  device) or would take long (TensorFlow under horovodrun); the why names the test that runs
  its like.
- ``<!-- launch: LAUNCHER ARGS ... setup -->`` before a Python block: the block, after the
  setup lines of the comment, runs as a script under a real ``torchrun`` or ``horovodrun``
  (``horovodrun`` skips without Horovod, unless ``AIKIT_REQUIRE_HOROVOD=1``).
- ```` ```console ````: each ``$ command`` runs in bash in the document's directory with this
  Python's ``aikit`` command, must exit 0, and must print the lines that follow it (trailing
  spaces aside).
- ```` ```bash ````: commands to install or to launch a job (not run here: they install
  packages or need hosts); checked that every ``pip install`` names the distribution and
  extras setup.py declares and that every path of this repository they name exists.

pytest collects README.md and docs/ (pyproject.toml's testpaths). Under pytest-xdist the blocks
of one document run on one worker, in order (``pytest_xdist_make_scheduler`` below).
"""

from __future__ import annotations

import ast
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Example, Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' launcher helper, also when only docs/ is collected
from launching import run_launcher  # noqa: E402

BIN = Path(sys.executable).parent  # this Python's aikit, torchrun and horovodrun
LAUNCH_TIMEOUT = 300
os.environ.setdefault("MPLBACKEND", "Agg")  # the blocks' plots go to files


def setup_document(namespace: dict) -> None:
    """Each document runs in a temporary directory of its own, as a reader's working directory,
    which holds the guides' ``trace.csv`` (examples/trace.csv)."""
    namespace["__document_dir__"] = Path(tempfile.mkdtemp(prefix="aikit-docs-"))
    shutil.copy(ROOT / "examples" / "trace.csv", namespace["__document_dir__"] / "trace.csv")
    namespace["__previous_cwd__"] = os.getcwd()
    root = logging.getLogger()
    namespace["__logging__"] = root.level, list(root.handlers)
    os.chdir(namespace["__document_dir__"])


def teardown_document(namespace: dict) -> None:
    os.chdir(namespace["__previous_cwd__"])
    shutil.rmtree(namespace["__document_dir__"], ignore_errors=True)
    root = logging.getLogger()  # a block's logging.basicConfig must not reach the next tests
    root.setLevel(namespace["__logging__"][0])
    root.handlers[:] = namespace["__logging__"][1]
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


class NextPythonBlock:
    """A directive in an HTML comment that changes how the next Python block runs."""

    directive = ""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive=self.directive, arguments=".+?")

    def __call__(self, document):
        for region in self.lexer(document):
            region.parsed = (region.lexemes["arguments"].strip(), str(region.lexemes.get("source") or ""))
            region.evaluator = self.install
            yield region

    def install(self, example: Example) -> None:
        arguments, body = example.parsed
        document = example.document

        def once(next_example: Example):
            if next_example.region.lexemes.get("arguments") != "python":
                raise NotEvaluated()
            document.pop_evaluator(once)
            return self.run(next_example, arguments, body)

        document.push_evaluator(once)

    def run(self, example: Example, arguments: str, body: str):
        raise NotImplementedError


class Fragment(NextPythonBlock):
    """``<!-- fragment: why -->``: the next block is an excerpt; reported as skipped."""

    directive = "fragment"

    def run(self, example, arguments, body):
        raise SkipTest(f"fragment: {arguments}")


class Launch(NextPythonBlock):
    """``<!-- launch: torchrun|horovodrun ARGS`` + setup lines ``-->``: the next block runs as
    a script under that launcher, with this checkout on every worker's path."""

    directive = "launch"

    def run(self, example, arguments, body):
        launcher, *args = shlex.split(arguments)
        script = Path.cwd() / f"block_{example.line}.py"
        if launcher == "torchrun":
            command = [sys.executable, "-m", "torch.distributed.run", *args, str(script)]
        elif launcher == "horovodrun":
            missing = horovod_missing()
            if missing:
                if os.environ.get("AIKIT_REQUIRE_HOROVOD") == "1":
                    raise AssertionError(f"AIKIT_REQUIRE_HOROVOD=1 but Horovod is not installed ({missing})")
                raise SkipTest(f"needs Horovod ({missing}): run scripts/install_horovod.sh")
            command = [str(BIN / "horovodrun"), *args, sys.executable, str(script)]
        else:
            pytest.fail(f"launch: {launcher!r} is not torchrun or horovodrun")
        script.write_text(f"{body}\n{example.parsed}")
        env = {name: value for name, value in os.environ.items()
               if name not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
        done = run_launcher(f"{launcher} of {example.path}:{example.line}", command, env, timeout=LAUNCH_TIMEOUT)
        if done.returncode:
            raise AssertionError(f"{arguments} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-8000:]}")


def horovod_missing() -> str | None:
    if not (BIN / "horovodrun").exists():
        return f"{BIN / 'horovodrun'} not found"
    try:
        import horovod.torch  # noqa: F401
    except ImportError as error:
        return f"import horovod.torch failed: {error}"
    return None


def run_console(example: Example) -> None:
    """A ```console block: ``$ command`` lines, each followed by the output it must print."""
    sessions: list[tuple[str, list[str]]] = []
    for line in str(example.parsed).splitlines():
        if line.startswith("$ "):
            sessions.append((line[2:], []))
        elif sessions:
            sessions[-1][1].append(line.rstrip())
        else:
            raise AssertionError(f"a console block starts with '$ command', not {line!r}")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "COLUMNS": "100"}
    for command, expected in sessions:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120)
        printed = [line.rstrip() for line in (done.stdout + done.stderr).splitlines()]
        assert done.returncode == 0, f"$ {command}\nexited {done.returncode}:\n{done.stdout}{done.stderr}"
        assert printed == expected, "$ {}\nprints:\n{}\nbut the docs show:\n{}".format(
            command, "\n".join(printed), "\n".join(expected))


def setup_py() -> tuple[str, set[str]]:
    """setup.py's distribution name and extras, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    keywords = {keyword.arg: keyword.value for keyword in call.keywords}
    extras = {key.value for key in keywords["extras_require"].keys}
    return keywords["name"].value, extras


REPOSITORY_PATH = re.compile(r"(?<![\w./-])\.?/?((?:scripts|examples|tests|benchmarks|docs|requirements)/[\w./-]*\w)")


def check_bash(example: Example) -> None:
    """A ```bash block is not run; what it names must exist: the distribution and its extras,
    and the repository's own files."""
    name, extras = setup_py()
    for line in str(example.parsed).splitlines():
        command = line.split("#")[0]
        for spec in re.findall(r"pip install\s+(?:-\S+\s+)*'?([\w.-]+(?:\[[\w,]+\])?)'?", command):
            distribution, _, wanted = spec.partition("[")
            assert distribution == name, f"{line.strip()!r} installs {distribution!r}; aikit's distribution is {name!r}"
            unknown = set(filter(None, wanted.rstrip("]").split(","))) - extras
            assert not unknown, f"{line.strip()!r} asks for extras {sorted(unknown)} that setup.py does not declare"
        for path in REPOSITORY_PATH.findall(command):
            assert (ROOT / path).exists(), f"{line.strip()!r} names {path}, which is not in the repository"


markdown = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        SkipParser(),
        Fragment(),
        Launch(),
        CodeBlockParser(language="console", evaluator=run_console),
        CodeBlockParser(language="bash", evaluator=check_bash),
    ],
    patterns=["README.md", "docs/*.md"],
    setup=setup_document,
    teardown=teardown_document,
)
pytest_collect_file = markdown.pytest()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's ``load``, except that the blocks of one document, which share a namespace,
    go to one worker as one unit, in order, and so do the tests of one module of tests/ray, which
    share one local Ray cluster. (Its ``loadgroup`` would do this with xdist_group marks, but
    pytest 9 no longer lets xdist 3.8 rename the items it groups.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class DocumentsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return path if path.endswith(".md") or path.startswith("tests/ray/") else nodeid

    return DocumentsTogether(config, log)
