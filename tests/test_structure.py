"""The shape of the package, checked from its source: notebooks in dependency order (no module imports a module
exported from a later notebook, not even inside a function, so there is no import cycle), one file writer
(`wf_nb.io`), and exported cells short enough to read."""
import ast, builtins, json, re, statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG, NBS = ROOT / 'wf_nb', ROOT / 'nbs'


def notebook_of() -> dict[str, str]:
    "module name -> the notebook it is exported from (nbdev writes it in the module's header)."
    out = {}
    for py in PKG.glob('*.py'):
        m = re.search(r'File to edit: \.\./nbs/([\w.-]+)\.ipynb', py.read_text())
        if m: out[py.stem] = m.group(1)
    return out


def wf_imports(path: Path) -> list[tuple[str, int]]:
    "`(module, line)` of every wf_nb module `path` imports, at the top or inside a function."
    name, out = path.stem, []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ''
            if node.level: mod = 'wf_nb.' + mod if mod else 'wf_nb'
            if mod == 'wf_nb': out += [(a.name, node.lineno) for a in node.names if (PKG / f'{a.name}.py').exists()]
            elif mod.startswith('wf_nb.'): out.append((mod.split('.')[1], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name.split('.')[1], node.lineno) for a in node.names if a.name.startswith('wf_nb.')]
    return [(m, ln) for m, ln in out if m != name]


def test_every_module_comes_from_a_notebook():
    nb = notebook_of()
    missing = [p.stem for p in PKG.glob('*.py') if p.stem not in nb and p.stem not in ('_modidx',)]
    assert not missing, f"modules not exported from a notebook: {missing}"


def test_modules_import_only_earlier_notebooks():
    "Sorting the notebooks by name is a topological order of the imports: no back-edge, hence no cycle."
    nb, bad = notebook_of(), []
    for py in sorted(PKG.glob('*.py')):
        if py.stem not in nb or py.stem == '__init__': continue   # the package (12_api) may import anything, lazily
        for mod, line in wf_imports(py):
            if mod in nb and nb[mod] >= nb[py.stem]:
                bad.append(f"wf_nb/{py.name}:{line} ({nb[py.stem]}) imports wf_nb.{mod} ({nb[mod]})")
    assert not bad, "imports of a later notebook:\n" + '\n'.join(bad)


def test_no_import_by_name():
    "Modules are imported with `import` statements the test above can see, not by name at run time."
    bad = [f"{py.name}:{i + 1}" for py in PKG.glob('*.py') if py.stem not in ('__init__', '_modidx')
           for i, l in enumerate(py.read_text().splitlines()) if re.search(r'\bimport_module\(|__import__\(', l)]
    assert not bad, f"import by name: {bad}"


def test_one_file_writer():
    "Only wf_nb.io renames files into place; everyone else calls it (so crash and race rules live in one place)."
    pat = re.compile(r'\bos\.(replace|rename)\(|\.rename\(|shutil\.move\(|tempfile\.mk(s|d)temp\(')
    bad = [f"wf_nb/{py.name}:{i + 1}: {l.strip()}" for py in sorted(PKG.glob('*.py')) if py.stem not in ('io', '_modidx')
           for i, l in enumerate(py.read_text().splitlines()) if pat.search(l)]
    assert not bad, "write through wf_nb.io instead:\n" + '\n'.join(bad)


def test_the_checker_sees_a_back_edge(tmp_path):
    "The import parser finds relative, absolute and function-level imports (else the order test could pass vacuously)."
    p = tmp_path / 'x.py'
    p.write_text("from .config import A\nimport wf_nb.trainer as t\ndef f():\n    from wf_nb import stages\n    from . import io\n")
    assert sorted(m for m, _ in wf_imports(p)) == ['config', 'io', 'stages', 'trainer']


def exported_cell_lines(nb: Path) -> list[tuple[str, int, str]]:
    "`(cell id, lines, first line)` of each exported cell of `nb`: its lines after `#| export`, blank lines and docstrings included."
    out = []
    for c in json.loads(nb.read_text())['cells']:
        src = ''.join(c['source']).splitlines()
        if c['cell_type'] == 'code' and src and src[0].startswith('#| export'): out.append((c.get('id'), len(src) - 1, src[1][:60] if len(src) > 1 else ''))
    return out


CELL_MEDIAN, CELL_MAX = 15, 45


def test_exported_cells_are_short():
    "One exported idea per cell (as nbdev's own notebooks): in every notebook the median exported cell is <= 15 lines, none over 45."
    bad = []
    for nb in sorted(NBS.glob('*.ipynb')):
        cells = exported_cell_lines(nb)
        if not cells: continue
        bad += [f"{nb.name} cell {cid}: {n} lines ({first})" for cid, n, first in cells if n > CELL_MAX]
        if statistics.median(n for _, n, _ in cells) > CELL_MEDIAN:
            bad.append(f"{nb.name}: median exported cell {statistics.median(n for _, n, _ in cells)} lines")
    assert not bad, f"split these (one idea per cell, prose between; median <= {CELL_MEDIAN}, max <= {CELL_MAX}):\n" + '\n'.join(bad)


def test_the_cell_counter_counts(tmp_path):
    "The cell measure counts the lines after `#| export` and only exported code cells."
    nb = tmp_path / 'x.ipynb'
    cell = lambda t, s: {'cell_type': t, 'id': str(len(s)), 'metadata': {}, 'source': s}
    nb.write_text(json.dumps({'cells': [cell('code', '#| export\ndef f():\n\n    return 1'), cell('code', 'x = 1\ny = 2'),
                                        cell('markdown', '#| export\ntext')]}))
    assert [n for _, n, _ in exported_cell_lines(nb)] == [3]


# what a full disk looks like in the messages of torch.save, safetensors and numpy: a test of these is a test of text
MESSAGE_SNIFFING = ['No space left on device', 'StorageFull', 'file write failed', 'inline_container', ' requested and ']


def test_no_exit_code_from_message_text():
    """The `wf` command maps exceptions to exit codes by type only (`wf_nb.errors.exit_code`): no module reads error text
    to find a full disk (the writers raise `DiskFull`), and none picks a code by the module an exception comes from."""
    bad = [f"wf_nb/{py.name}:{i + 1}: {l.strip()}" for py in sorted(PKG.glob('*.py')) if py.stem not in ('errors', '_modidx')
           for i, l in enumerate(py.read_text().splitlines())
           if any(m in l for m in MESSAGE_SNIFFING) or re.search(r'__module__\.startswith\([\'"]wf_nb', l)]
    assert not bad, "exit codes from message text (raise a typed error from wf_nb.errors instead):\n" + '\n'.join(bad)


BUILTIN_ERRORS = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), Exception)
                  and not issubclass(getattr(builtins, n), Warning)}


def error_classes() -> dict[str, tuple[str, list[str]]]:
    "Every public exception class defined in wf_nb but the Trainer's control flow (`Cancel*Exception`): name -> (module, bases)."
    out = {}
    for py in sorted(PKG.glob('*.py')):
        for node in ast.walk(ast.parse(py.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith('_') and not re.fullmatch(r'Cancel\w*Exception', node.name):
                out[node.name] = (py.stem, [b.id if isinstance(b, ast.Name) else getattr(b, 'attr', '') for b in node.bases])
    known, grew = set(BUILTIN_ERRORS), True
    while grew:   # a class is an exception class if a base is one
        new = {n for n, (_, bases) in out.items() if n not in known and set(bases) & known}
        known |= new; grew = bool(new)
    return {n: v for n, v in out.items() if n in known and n not in BUILTIN_ERRORS}


def test_wf_errors_derive_from_wferror():
    "wf_nb's own exceptions derive from `WFError` (besides the builtin they extend), so `exit_code` needs only their type."
    classes = error_classes()
    def ok(n, seen=()):
        mod, bases = classes[n]
        return mod == 'errors' or 'WFError' in bases or any(b in classes and b not in seen and ok(b, seen + (n,)) for b in bases)
    assert {'ConfigError', 'CheckpointError', 'RunExistsError', 'DiskFull'} <= set(classes), sorted(classes)
    bad = [f"wf_nb/{classes[n][0]}.py: class {n}({', '.join(classes[n][1])})" for n in sorted(classes) if not ok(n)]
    assert not bad, "derive these from wf_nb.errors.WFError too:\n" + '\n'.join(bad)


def test_run_statuses_are_named_once():
    """A run status is written as a `Status` member everywhere; its text appears only in the enum (wf_nb/status.py).
    (FAILED and OK are also plain report words, e.g. `wf smoke: FAILED`, so the check names the three a run's life uses.)"""
    pat = re.compile(r"""['"](RUNNING|INTERRUPTED|COMPLETED)['"]""")
    bad = [f"wf_nb/{py.name}:{i + 1}: {l.strip()}" for py in sorted(PKG.glob('*.py')) if py.stem not in ('status', '_modidx')
           for i, l in enumerate(py.read_text().splitlines()) if pat.search(l)]
    assert not bad, "use wf_nb.status.Status:\n" + '\n'.join(bad)
