"""The documented blocks' checker (conftest.py at the repository root) fails a block that does
not do what the Markdown shows: each case is a small Markdown file run by the real checker in
a copy of the repository's test setup."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DOCUMENT = '''# A guide

<!-- invisible-code-block: python
hidden = 2                                  # a setup the page does not show
-->
```python
shown = hidden * 21
```

```python
assert shown == 42                          # the next block sees the names of the last
assert open("trace.csv").readline().strip() == "step,batchsize"
```

<!-- fragment: an excerpt of a loop -->
```python
optimizer.step()
```

```console
$ aikit plan --global-batch-size 8 --max-gpu-batch-size 4 --gpus 2
{plan}
```

```bash
pip install '{distribution}[torch]'
```

```bash
pip install '{distribution}[torch,tf]'
```

```bash
bash scripts/test.sh
```
'''


# the examples of DOCUMENT, in order (a fragment mark is one)
BLOCKS = ("hidden setup", "first", "second", "fragment mark", "fragment", "console", "install", "extras", "script")


def check(tmp_path: Path, **changes: str) -> dict[str, str]:
    """Run the checker on DOCUMENT (with ``changes``); the outcome of each block."""
    for name in ("conftest.py", "setup.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples" / "trace.csv", tmp_path / "examples")
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "launching.py", tmp_path / "tests")  # conftest.py's launcher helper
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test.sh").write_text("")
    plan = subprocess.run([sys.executable, "-m", "aikit.cli", "plan", "--global-batch-size", "8",
                           "--max-gpu-batch-size", "4", "--gpus", "2"], capture_output=True, text=True,
                          check=True, cwd=ROOT).stdout
    text = DOCUMENT.replace("{plan}", "\n".join(line.rstrip() for line in plan.splitlines()))
    text = text.replace("{distribution}", "aikit-elastic")
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "README.md").write_text(text)
    done = subprocess.run([sys.executable, "-m", "pytest", "README.md", "-v", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=tmp_path)
    found = re.findall(r"^README\.md::line:(\d+),column:\d+ (PASSED|FAILED|SKIPPED|ERROR)", done.stdout, re.M)
    outcomes = [outcome for _, outcome in sorted(found, key=lambda pair: int(pair[0]))]
    assert len(outcomes) == len(BLOCKS), done.stdout[-3000:]
    return dict(zip(BLOCKS, outcomes, strict=True))


def test_every_block_of_a_true_document_passes_and_a_fragment_is_skipped(tmp_path):
    outcomes = check(tmp_path)
    assert outcomes.pop("fragment") == "SKIPPED"
    assert set(outcomes.values()) == {"PASSED"}


def test_each_block_that_does_not_do_what_the_page_shows_fails(tmp_path):
    outcomes = check(tmp_path, **{
        "assert shown == 42": "assert shown == 41",  # a block that fails
        "global batch 8, at most 4 per device": "global batch 8, at most 2 per device",  # not the output
        "pip install 'aikit-elastic[torch]'\n": "pip install 'aikit[torch]'\n",  # another project
        "pip install 'aikit-elastic[torch,tf]'": "pip install 'aikit-elastic[torch,pytorch]'",  # no such extra
        "bash scripts/test.sh": "bash scripts/tests.sh",  # no such file
    })
    assert outcomes == {"hidden setup": "PASSED", "first": "PASSED", "second": "FAILED", "fragment mark": "PASSED",
                        "fragment": "SKIPPED", "console": "FAILED", "install": "FAILED", "extras": "FAILED",
                        "script": "FAILED"}
