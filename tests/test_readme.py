"""The README's code blocks run as written, offline, in a fresh folder (the long ones with small -n).

Regression: the README's `generate` examples, run in order after the first command, were refused
("'outputs' holds a run with other settings"). The built-in model is replaced by the tiny random
stand-in (`--weights`, with the shipped model's class names, so the README's names are checked)
and `-n` by 2, nothing else; `--model` examples need real checkpoints, so only their options are
parsed. A block that cannot run offline says so in an HTML comment just above it
(``<!-- not run offline: REASON -->``); every other block is run here.
"""

import re
import shlex
from pathlib import Path

import pytest

from csdgen import cli

from builtin_fixture import make_tiny_weights, shipped_classes, shipped_extra
import torch
import csdgen

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LIBRARY = (ROOT / "docs" / "library.md").read_text()
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", README, re.S)
#: every fenced block of the README: (its "not run offline" reason or None, language, code)
FENCED = [(m.group(1), m.group(2), m.group(3))
          for m in re.finditer(r"(?:<!-- not run offline: (.*?) -->\n)?```(\w+)\n(.*?)```", README, re.S)]


def csdgen_commands(kind: str = "bash") -> list[list[str]]:
    """Every `csdgen ...` command of the README's bash blocks, in order, as argv lists."""
    commands = []
    for lang, block in BLOCKS:
        if lang != kind:
            continue
        for line in block.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:1] == ["csdgen"]:
                    commands.append(words[1:])
    return commands


def small(argv: list[str], weights: Path) -> list[str]:
    argv = list(argv)
    if "-n" in argv:
        argv[argv.index("-n") + 1] = "2"
    else:
        argv += ["-n", "2"]
    return argv + ["--weights", str(weights)]


def test_readme_commands_run_in_order_in_a_fresh_folder(tmp_path, monkeypatch, capsys):
    weights = make_tiny_weights(tmp_path / "weights", shipped_classes(), shipped_extra(), grid=8)  # 64 tokens
    work = tmp_path / "clone"
    work.mkdir()
    monkeypatch.chdir(work)
    commands = [c for c in csdgen_commands() if "--model" not in c and c[:1] not in (["demo"], ["serve"])]  # they serve
    assert [c[0] for c in commands] == ["generate"] * 5 + ["compare", "sweep"]
    for argv in commands:
        assert cli.main(small(argv, weights)) == 0, (argv, capsys.readouterr().err)
    printed = capsys.readouterr().out
    assert "Food & Drink (" in printed and "red apple  (also: apple, \U0001F34E)" in printed  # --list-classes food
    # what the README says each command writes
    assert (work / "outputs" / "record.json").is_file() and (work / "outputs" / "0000_red-apple_map.png").is_file()
    assert sorted(p.name for p in (work / "emoji").glob("*.png")) == [
        "0000_red-apple.png", "0000_red-apple_map.png", "0001_panda-face.png", "0001_panda-face_map.png"]
    assert sorted(p.name for p in (work / "csd-w16").glob("*.png")) == [
        "0000_red-apple.png", "0000_red-apple_map.png", "0001_panda-face.png", "0001_panda-face_map.png"]
    for name in ("compare.md", "compare.csv", "compare.png", "run_csd.json", "run_csd.safetensors"):
        assert (work / "compare" / name).is_file(), name
    for name in ("sweep.md", "sweep.csv", "sweep.json", "frontier.png"):
        assert (work / "sweep" / name).is_file(), name
    # the same commands again: everything is resumed, nothing refused
    for argv in commands:
        assert cli.main(small(argv, weights)) == 0, argv


def test_readme_checkpoint_commands_parse():
    commands = [c for c in csdgen_commands() if "--model" in c]
    assert len(commands) >= 3
    parser = cli.build_parser()
    for argv in commands:
        args = parser.parse_args(argv)
        assert args.model and args.command == "generate"


def _run_python_block(code: str, weights: Path, name: str) -> dict:
    assert "load_builtin_model()" in code
    namespace: dict = {}
    exec(compile(code.replace("load_builtin_model()", f"load_builtin_model({str(weights)!r})"), name, "exec"), namespace)
    return namespace


def test_readme_library_example_runs(tmp_path, monkeypatch):
    """The README's five lines and docs/library.md's full example, on the tiny stand-in."""
    weights = make_tiny_weights(tmp_path / "weights", shipped_classes(), shipped_extra())
    monkeypatch.chdir(tmp_path)
    (short,) = [block for lang, block in BLOCKS if lang == "python" and "csdgen.generate(" in block]
    assert len(short.strip().splitlines()) <= 6
    namespace = _run_python_block(short, weights, "README.md")
    assert len(namespace["pictures"]) == 2 and namespace["result"].tokens.shape[0] == 2
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", LIBRARY, re.S) if "csdgen.generate(" in b]
    namespace = _run_python_block(code, weights, "docs/library.md")
    assert namespace["images"].shape == (2, 3, 64, 64) and len(namespace["pictures"]) == 2
    assert (tmp_path / "api-run" / "record.json").is_file() and (tmp_path / "api-run" / "0000_red-apple.png").is_file()
    names = namespace["model"].class_names
    assert [names[i] for i in namespace["ids"]] == ["red apple", "panda face"] and len(set(namespace["classes"])) == 4


def test_library_continuous_batch_example_gives_generates_images(tmp_path, monkeypatch):
    """docs/library.md's ContinuousBatch block: the image that joined the running batch, and the two
    it joined, are generate's images alone (static engine: the same tokens)."""
    import torch

    import csdgen

    weights = make_tiny_weights(tmp_path / "weights", shipped_classes(), shipped_extra())
    monkeypatch.chdir(tmp_path)
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", LIBRARY, re.S) if "ContinuousBatch(" in b]
    namespace = _run_python_block(code, weights, "docs/library.md")
    model, tokens, handles = namespace["model"], namespace["tokens"], namespace["handles"]
    assert sorted(tokens) == sorted(handles) and len(handles) == 3
    for handle, name, index in zip(handles, ["red apple", "panda face", "ghost"], [0, 1, 2]):
        alone = csdgen.generate(model, [name], seed=0, image_indices=[index], method="csd", window=16)
        assert torch.equal(tokens[handle], alone.tokens[0]), name


def test_readme_code_blocks_that_run_offline_run(tmp_path, monkeypatch):
    """Every README block not marked "not run offline" is run: its csdgen commands (generate,
    compare and sweep by the in-order test above, bench here with --limit 2, demo and serve parsed:
    they serve until stopped) and its library block (above). A new block of another kind fails here
    until it is run or marked."""
    weights = make_tiny_weights(tmp_path / "weights", shipped_classes(), shipped_extra(), grid=8)  # 64 tokens
    work = tmp_path / "clone"
    work.mkdir()
    monkeypatch.chdir(work)
    parser = cli.build_parser()
    ran = {"python": 0, "bench": 0, "server": 0}
    for reason, lang, code in FENCED:
        if reason is not None:
            assert len(reason.split()) >= 3, f"say why a block cannot run offline: {reason!r}"
            continue
        if lang == "python":
            assert "csdgen.generate(" in code, f"a python block that no test runs:\n{code}"
            ran["python"] += 1  # run by test_readme_library_example_runs
            continue
        assert lang in ("bash", "sh"), f"a {lang} block that no test runs:\n{code}"
        for line in code.splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if not words:
                    continue
                assert words[0] == "csdgen", f"mark it or make it a csdgen command: {part!r}"
                args = parser.parse_args(words[1:])
                if args.command in ("demo", "serve"):
                    ran["server"] += 1
                elif args.command == "bench":
                    argv = list(words[1:])
                    argv[argv.index("--limit") + 1] = "2"
                    assert cli.main(argv + ["--weights", str(weights)]) == 0, argv
                    assert (work / args.out / "report.md").is_file()
                    ran["bench"] += 1
                else:
                    assert args.command in ("generate", "compare", "sweep")  # run in order by the test above
    assert ran == {"python": 1, "bench": 1, "server": 2}


@pytest.mark.parametrize("command", ["generate", "compare", "sweep"])
def test_readme_lists_what_each_command_writes(command):
    assert f"- **`csdgen {command}`**" in README and f"## `csdgen {command}`" in CLI_DOC


def test_commands_in_the_docs_parse():
    parser = cli.build_parser()
    found = 0
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        inline = re.findall(r"`(csdgen (?:generate|compare|sweep) [^`]*)`", text)
        blocks = re.findall(r"^(csdgen (?:generate|compare|sweep) .*)$", text, re.M)
        for command in inline + blocks:
            words = shlex.split(command, comments=True)[1:]
            if words[-1] == "--model":  # prose naming the option, not a command
                continue
            parser.parse_args(words)
            found += 1
    assert found >= 2


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: Path) -> str:
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)


def test_links_in_the_readme_docs_and_results_lead_to_files_and_headings():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks" / "results").glob("*.md"))]
    broken, checked = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            checked += 1
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in {
                    _slug(h) for h in re.findall(r"^#+ (.*)$", _prose(dest), re.M)}:
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken
    assert checked >= 30


def test_readme_first_command_on_the_shipped_weights_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    """The README's first command, on the weights that ship (one image instead of eight): it prints
    the model and device, then one summary line, and writes the image, its map and record.json."""
    (first,) = [c for c in csdgen_commands()[:1]]
    assert first == ["generate", "--out", "outputs"]
    monkeypatch.chdir(tmp_path)
    assert cli.main(first + ["-n", "1"]) == 0
    printed = capsys.readouterr()
    (model_line,) = [line for line in printed.err.splitlines() if line.strip()]  # a note: on stderr
    (summary,) = [line for line in printed.out.splitlines() if line.strip()]
    assert model_line.startswith("csdgen generate: the built-in model on cpu"), model_line
    assert summary.startswith("1 image, 256 tokens") and "step compression" in summary and "decoding" in summary
    assert summary.endswith("-> outputs/"), summary
    assert sorted(p.name for p in (tmp_path / "outputs").iterdir()) == [
        "0000_red-apple.png", "0000_red-apple_map.png", "record.json"]


def cli_help_of(command: str) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return buffer.getvalue()


def test_fixed_window_across_batch_sizes_holds_what_the_readme_says():
    """On the built-in model: a rerun at the same batch size is bit-identical; across batch sizes a
    row's logits agree to float32 summation order (here within 1e-4), which is what the README
    promises now (no longer "bit-identical images for any --batch-size")."""
    from csdgen.models.builtin import load_builtin_model

    model = load_builtin_model()
    classes = [0, 1, 2, 3]
    once = csdgen.generate(model, classes, method="csd", window=16, seed=7)
    again = csdgen.generate(model, classes, method="csd", window=16, seed=7)
    assert torch.equal(once.tokens, again.tokens) and [s.steps for s in once.images] == [s.steps for s in again.images]
    start = 100
    tokens = once.tokens
    with torch.no_grad():
        def window_logits(rows):
            session = model.start([classes[r] for r in rows], None, True)
            session.prefill()
            session.forward(tokens[rows, :start], torch.zeros(len(rows), dtype=torch.long))
            out = session.forward(tokens[rows, start : start + 16], torch.full((len(rows),), start))
            return out.cond, out.uncond

        together = window_logits(list(range(4)))
        for r in range(4):
            alone = window_logits([r])
            for a, b in zip(together, alone):
                assert (a[r] - b[0]).abs().max() < 1e-4
    readme = " ".join(((ROOT / "README.md").read_text() + (ROOT / "docs" / "cli.md").read_text()).split())
    assert "bit-identical images for any `--batch-size`" not in readme
    assert "summation order" in readme and "same batch size" in readme
    assert "same images for any --batch-size" not in " ".join(cli_help_of("generate").split())


def test_docs_name_each_sweep_grid_option_with_its_default():
    """docs/cli.md named none of sweep's grid options (--csd-lam, ..., --windows) nor its window 16,
    so a reader of "compare uses window 32" could not tell that sweep's CSD rows run at 16; each is
    named with the default the parser has."""
    args = cli.build_parser().parse_args(["sweep"])
    doc = " ".join(CLI_DOC.split())
    for option in ("--csd-lam", "--csd-delta", "--addition-c", "--gsd-radius", "--lantern-delta", "--windows",
                   "--draft-inits", "--baselines"):
        default = ",".join(str(v) for v in getattr(args, option[2:].replace("-", "_")))
        assert f"`{option}` ({default}" in doc, (option, default)
    assert f"`sweep` runs at `--windows {','.join(map(str, args.windows))}`" in doc
