"""Build wf_nb's documentation site from the notebooks, offline.

    python docs/build.py [--out docs/_site] [--execute]

Quarto (what `nbdev_docs` uses) cannot be installed without downloading its binary, so this builds the site with
nbdev's own notebook reading plus nbconvert: each notebook under nbs/ becomes one page, in dependency order, with
`#|` directives stripped, `#| hide` cells removed, and every exported function or class followed by its rendered
signature and docstring (what nbdev's `show_doc` adds). `--execute` runs the notebooks first so pages show outputs
(slow on a CPU; the default pages show code only). The executed ablation reports of papermill_runs/reports/*/*/ get a
page each, with their committed outputs. Where Quarto is installed, `nbdev_docs` works as usual.
"""
import argparse, html, importlib, inspect, json, re, shutil, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r'^\s*#\|\s*(.*)$')

def directives(src: str) -> dict:
    "The `#| key value` lines at the top of a cell."
    out = {}
    for line in src.splitlines():
        m = DIRECTIVE.match(line)
        if not m: break
        key, _, val = m.group(1).partition(' ')
        out[key.strip()] = val.strip()
    return out

def strip_directives(src: str) -> str:
    lines = src.splitlines()
    while lines and DIRECTIVE.match(lines[0]): lines.pop(0)
    return '\n'.join(lines)

def exported_names(src: str) -> list[str]:
    "Top-level functions and classes defined in an exported cell."
    return re.findall(r'^(?:def|class)\s+([A-Za-z]\w*)', src, flags=re.M)

def show_doc(obj, name: str) -> str:
    "Markdown for an object's signature and docstring (a small `show_doc`)."
    try: sig = str(inspect.signature(obj))
    except (TypeError, ValueError): sig = ''
    kind = 'class' if inspect.isclass(obj) else 'def'
    doc = inspect.getdoc(obj) or ''
    return f"#### `{name}`\n\n```python\n{kind} {name}{sig}\n```\n\n{doc}\n"

def process(nb_path: Path) -> tuple[dict, str, str]:
    "The notebook as a docs page (nbformat dict), its title and its one-line summary."
    nb = json.loads(nb_path.read_text())
    module, cells, title, summary = None, [], nb_path.stem, ''
    for c in nb['cells']:
        src = ''.join(c['source']) if isinstance(c['source'], list) else c['source']
        if c['cell_type'] == 'markdown':
            if title == nb_path.stem and (m := re.search(r'^#\s+(.+)$', src, re.M)): title = m.group(1).strip()
            if not summary and (m := re.search(r'^>\s+(.+)$', src, re.M)): summary = m.group(1).strip()
            cells.append({**c, 'source': src}); continue
        d = directives(src)
        if 'default_exp' in d: module = d['default_exp']; continue
        if 'hide' in d or 'exporti' in d: continue
        body = strip_directives(src)
        if not body.strip(): continue
        cells.append({**c, 'source': body, 'outputs': c.get('outputs', [])})
        if 'export' in d and module:
            mod = importlib.import_module('wf_nb' if module == '__init__' else f'wf_nb.{module}')
            for name in exported_names(body):
                if hasattr(mod, name):
                    cells.append({'cell_type': 'markdown', 'metadata': {}, 'source': show_doc(getattr(mod, name), name)})
    page = {**nb, 'cells': cells}
    return page, title, summary

def build(out: Path, execute: bool = False) -> list[Path]:
    "Render every notebook to `out/NAME.html` and write `out/index.html`; returns the pages."
    import nbformat
    from nbconvert import HTMLExporter
    if execute:
        from nbconvert.preprocessors import ExecutePreprocessor
    nbs = sorted((ROOT/'nbs').glob('*.ipynb'), key=lambda p: (p.stem != 'index', p.stem))
    tmp = out.with_name(out.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True); tmp.mkdir(parents=True)
    exporter = HTMLExporter(template_name='lab')
    toc, pages = [], []
    for p in nbs:
        page, title, summary = process(p)
        nb = nbformat.from_dict(page)
        if execute: ExecutePreprocessor(timeout=1800).preprocess(nb, {'metadata': {'path': str(ROOT/'nbs')}})
        body, _ = exporter.from_notebook_node(nb, resources={'metadata': {'name': title}})
        name = 'home.html' if p.stem == 'index' else f'{p.stem}.html'
        (tmp/name).write_text(body)
        toc.append((name, title, summary)); pages.append(out/name)
    for rep in sorted((ROOT/'papermill_runs'/'reports').glob('*/*/report.ipynb')):   # executed ablation reports, outputs as committed
        nb = nbformat.read(str(rep), as_version=4)
        title = f"Ablation report: {rep.parent.parent.name} ({rep.parent.name} protocol)"
        body, _ = exporter.from_notebook_node(nb, resources={'metadata': {'name': title}})
        name = f'ablation-{rep.parent.parent.name}-{rep.parent.name}.html'
        (tmp/name).write_text(body)
        cmd = (rep.parent/'command.txt').read_text().strip() if (rep.parent/'command.txt').exists() else ''
        toc.append((name, title, cmd)); pages.append(out/name)
    items = '\n'.join(f'<li><a href="{n}">{html.escape(t)}</a> <span>{html.escape(s)}</span></li>' for n, t, s in toc)
    (tmp/'index.html').write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>wf_nb</title>
<style>body{{font-family:system-ui,sans-serif;max-width:56rem;margin:2rem auto;line-height:1.5}}span{{color:#555}}</style>
</head><body><h1>wf_nb</h1><p>Notebook-first training of 1.58-bit and small efficient LLMs. The notebooks, in reading order:</p>
<ol>{items}</ol></body></html>""")
    shutil.rmtree(out, ignore_errors=True); tmp.rename(out)   # never a half-built site
    return pages

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default=str(ROOT/'docs'/'_site')); ap.add_argument('--execute', action='store_true')
    a = ap.parse_args()
    pages = build(Path(a.out), a.execute)
    print(f"built {len(pages)} pages + index.html in {a.out}")
