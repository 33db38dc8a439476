"""The shape of the package, checked from its source: notebooks in dependency order (no module imports a module
exported from a later notebook, not even inside a function, so there is no import cycle), one file writer
(`wf_nb.io`), and exported cells short enough to read."""
import ast, json, re
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


def test_exported_cells_are_short():
    "One exported idea per cell: no exported cell holds more than 60 lines of code (split it, with prose between)."
    long = []
    for nb in sorted(NBS.glob('*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            src = ''.join(c['source']).splitlines()
            if c['cell_type'] == 'code' and src and src[0].startswith('#| export') and len(src) - 1 > 60:
                long.append(f"{nb.name} cell {c.get('id')}: {len(src) - 1} lines ({src[1][:60]})")
    assert not long, "exported cells over 60 lines:\n" + '\n'.join(long)
