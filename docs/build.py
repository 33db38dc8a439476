"""Build wf_nb's documentation site from the notebooks, offline.

    python docs/build.py                     # execute the notebooks (cached), render every page into docs/_site/
    python docs/build.py --execute none      # prose, code and API reference only (outputs from the cache where present)
    python docs/build.py --execute 00a_config,06_trainer     # execute only these (the others: cache or no outputs)
    python docs/build.py --renderer quarto   # nbdev's own `nbdev_docs` (Quarto); the default when `quarto` is on PATH

The pages come out of nbdev's own notebook processing: `nbdev.process.NBProcessor` with nbdev's docs processors
(`nbdev.processors.FilterDefaults`: front matter, `add_show_docs`, `hide`, `rm_export`, `add_links`, ...), so every
exported function and class gets nbdev's `show_doc` (signature, docstring, parameter table) where it is defined, and
backticked names link to their reference. One processor is swapped: nbdev's `exec_show_docs` runs each notebook's
import and export cells in a kernel to evaluate `show_doc`, which fails on cells that mix imports with code; here
`show_doc` is evaluated against the module the notebook exports to, which holds the same objects.

Quarto cannot be installed offline (its PyPI package downloads a binary), so without it the processed notebooks are
rendered with nbconvert into one site: a sidebar in reading order, a search box (a prebuilt index, no server), a
landing page with the quick start (nbs/index.ipynb), a "Pipeline" page (docs/pipeline.md, with README's measured
tables), and the reports (papermill_runs/reports/**, benchmark scripts). Executed notebooks are cached in
docs/_cache/ by content hash, so a rebuild re-executes only what changed.
"""
from __future__ import annotations
import argparse, hashlib, html, importlib, json, os, re, shutil, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
CACHE = DOCS / '_cache'
EXEC_VERSION = '4'                      # bump when `_exec_child` changes what it saves (4: a Jupyter kernel)
SKIP_FLAGS = ('slow', 'cuda')           # as nbdev_test (settings.ini tst_flags): these cells are not executed
REPO_URL = [os.environ.get('WF_DOCS_REPO_URL', ''), 'main']   # (repository URL, branch) for source links; '' ships the sources
LINKED: set[str] = set()                # repository files the pages link to (shipped under src/)

def page_name(nb_path: Path) -> str:
    "The page a notebook becomes: nbdev's naming (`01_quant.ipynb` -> `quant.html`), which its doc links use."
    from nbdev.frontmatter import _nbpath2html
    return _nbpath2html(Path(nb_path)).name

# ---------------------------------------------------------------- execution (cached, in child processes)
def _lib_hash() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / 'wf_nb').glob('*.py')): h.update(p.read_bytes())
    return h.hexdigest()[:16]

def cached_path(nb: Path, lib: str) -> Path:
    key = hashlib.sha256(nb.read_bytes() + EXEC_VERSION.encode()).hexdigest()[:16]
    return CACHE / f"{nb.stem}-{key}-{lib}.ipynb"

def skip_reason(cell, flags=SKIP_FLAGS) -> str:
    "Why `nbdev_test` would not run this cell ('' when it runs): a flag of `flags` (`#| slow`, `#| cuda`), `#| eval: false`, `nbdev_export()`."
    from nbdev.process import extract_directives
    if cell.get('cell_type') != 'code': return 'markdown'
    from fastcore.basics import AttrDict
    d = extract_directives(AttrDict(source=cell['source']), remove=False)
    if d.get('eval:', [''])[0].lower() == 'false': return 'eval: false'
    if 'nbdev_export' + '(' in cell['source']: return 'nbdev_export'
    hit = [f for f in flags if f in d]
    return hit[0] if hit else ''

def run_in_kernel(src: Path, dst: Path | None = None, cwd: Path | None = None, flags=SKIP_FLAGS, timeout: int = 1800,
                  kernel: str = 'python3') -> dict:
    """Execute notebook `src` in a fresh Jupyter kernel (`kernel`, the one JupyterLab and papermill start), cell by cell
    in order as Run All does, skipping the cells `nbdev_test` skips (`skip_reason`), stopping at the first error. Saves the
    executed notebook to `dst` (outputs included; `\\r` progress redraws collapsed as a Jupyter frontend shows them), also when
    a cell failed. Returns `{ran, skipped: {reason: n}, seconds, error}`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    src = Path(src); nb = nbformat.read(src, as_version=4)
    info = dict(ran=0, skipped={}, seconds=0.0, error=None)
    class Client(NotebookClient):
        async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
            why = skip_reason(cell, flags)
            if why:
                if why != 'markdown': info['skipped'][why] = info['skipped'].get(why, 0) + 1
                return cell
            info['ran'] += 1
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
    import tempfile
    from jupyter_client.manager import AsyncKernelManager
    ipc = tempfile.mkdtemp(prefix='wf-kernel-')    # a local socket, not TCP (no unencrypted-port warning)
    km = AsyncKernelManager(kernel_name=kernel, transport='ipc', ip=os.path.join(ipc, 'k'))
    client = Client(nb, km=km, timeout=timeout, kernel_name=kernel, coalesce_streams=True, record_timing=False,
                    resources={'metadata': {'path': str(cwd or src.parent)}})
    client.owns_km = True                          # shut the kernel down afterwards, as for a kernel it started itself
    t0 = time.time()
    try: client.execute()
    except CellExecutionError as e: info['error'] = str(e)
    finally: shutil.rmtree(ipc, ignore_errors=True)
    info['seconds'] = round(time.time() - t0, 1)
    if dst is not None:
        for c in nb.cells: c.get('metadata', {}).pop('execution', None)
        tmp = Path(dst).with_suffix('.tmp'); nbformat.write(nb, tmp); os.replace(tmp, dst)
    return info

def _exec_child(src: str, dst: str):
    "`run_in_kernel` in its own process (so a notebook's kernel and environment are fresh); exit 1 when a cell failed."
    for k, v in KERNEL_ENV.items(): os.environ.setdefault(k, v)
    os.environ.pop('MPLBACKEND', None)             # the kernel's own inline backend, as in JupyterLab
    info = run_in_kernel(Path(src), Path(dst))
    print(json.dumps({k: v for k, v in info.items() if k != 'error'}))
    if info['error']: print(info['error'], file=sys.stderr); sys.exit(1)

# Progress bars are redrawn live in JupyterLab; in a saved notebook and on a docs page they are debris. tqdm's
# "IProgress not found" warning (a kernel without ipywidgets, raised when torch imports tqdm.auto) is known noise.
KERNEL_ENV = {'TQDM_DISABLE': '1', 'HF_HUB_DISABLE_PROGRESS_BARS': '1', 'HF_DATASETS_DISABLE_PROGRESS_BARS': '1',
              'PYTHONWARNINGS': 'ignore:IProgress not found'}
# the final line of a progress bar that ignores those (lm-eval passes tqdm's `disable` itself): dropped from the pages
PROGRESS_LINE = re.compile(r'^.*\[(\d+:)?\d\d:\d\d(<(\d+:)?\d\d:\d\d|<\?)?, [^\]]*/s\]\s*$', re.M)

def execute_one(nb: Path, dst: Path, timeout: int = 1800, env: dict | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    "Run notebook `nb` in a fresh process and kernel (`_exec_child`), its executed copy written to `dst`: `(process, info)`."
    env = {**os.environ, 'PYTHONPATH': str(ROOT) + os.pathsep + os.environ.get('PYTHONPATH', ''), **(env or {})}
    r = subprocess.run([sys.executable, __file__, '--exec-one', str(nb), str(dst)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    try: info = json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError): info = {}
    return r, info

def store(nb: Path, executed: Path, lib: str | None = None) -> Path:
    "Keep `executed` (a successful run of notebook `nb`) in the cache as its executed copy; returns the cached path."
    CACHE.mkdir(parents=True, exist_ok=True)
    dst = cached_path(nb, lib or _lib_hash())
    for old in CACHE.glob(f'{nb.stem}-*.ipynb'):
        if old != dst: old.unlink()
    if Path(executed).parent == CACHE: os.replace(executed, dst)
    elif Path(executed) != dst: shutil.copyfile(executed, dst.with_suffix('.tmp')); os.replace(dst.with_suffix('.tmp'), dst)
    return dst

def execute(nbs: list[Path], jobs: int = 2, timeout: int = 1800, log=print) -> dict[Path, Path]:
    "Executed copies of `nbs` (from the cache, or run now in a kernel, `jobs` at a time); a notebook that fails keeps no outputs."
    CACHE.mkdir(parents=True, exist_ok=True)
    lib, done = _lib_hash(), {}
    def one(nb):
        dst = cached_path(nb, lib)
        if dst.exists(): return nb, dst
        tmp = CACHE / f'{nb.stem}.running.ipynb'
        r, info = execute_one(nb, tmp, timeout)
        if r.returncode or not tmp.exists():
            log(f"  ! {nb.name} failed to execute; its page shows no outputs\n{r.stderr[-1500:]}"); return nb, None
        log(f"  executed {nb.name} in {info.get('seconds', '?')}s"); return nb, store(nb, tmp, lib)
    with ThreadPoolExecutor(jobs) as ex:
        for nb, dst in ex.map(one, nbs):
            if dst: done[nb] = dst
    return done

def _executed(nbs, execute_which: str, jobs: int, log) -> dict[Path, Path]:
    "Executed copies: the notebooks `execute_which` names ('all', 'none', or names) run now or from the cache, any other cached."
    names = execute_which.split(',')
    want = nbs if execute_which == 'all' else [p for p in nbs if p.stem in names or p.name in names]
    executed, lib = execute(want, jobs=jobs, log=log) if want else {}, _lib_hash()
    for p in nbs:                                  # outputs of earlier runs of an unchanged notebook
        if p not in executed and cached_path(p, lib).exists(): executed[p] = cached_path(p, lib)
    return executed

# ---------------------------------------------------------------- nbdev processing
def _plain_doc(call: str, ns: dict) -> str:
    "The signature and docstring of the object named in a `show_doc(X)` call, as markdown (no parameter table)."
    import inspect
    name = call[call.index('(') + 1:].split(',')[0].split(')')[0].strip()
    obj = eval(name, ns)
    try: sig = str(inspect.signature(obj))
    except (TypeError, ValueError): sig = ''
    doc = inspect.getdoc(obj) or ''
    return f"### {name.split('.')[-1]}\n\n```python\n{name.split('.')[-1]}{sig}\n```\n\n{doc}\n"

def _shown_obj(call: str, ns: dict):
    "The object a `show_doc(X, ...)` call documents (None when it cannot be evaluated)."
    try: return eval(call[call.index('(') + 1:].split(',')[0].split(')')[0].strip(), ns)
    except Exception: return None

def source_href(rel: str, line: int | None = None) -> str:
    """Where a source link points: the file in the configured repository (`--repo-url` / `WF_DOCS_REPO_URL`, at the
    settings.ini branch), else the copy shipped with the site (`src/`: notebooks as they are, modules as highlighted
    pages with line anchors). settings.ini's `git_url` is a placeholder, so it is never linked."""
    if REPO_URL[0]:
        return f"{REPO_URL[0].rstrip('/')}/blob/{REPO_URL[1]}/{rel}" + (f'#L{line}' if line else '')
    LINKED.add(rel)
    if re.fullmatch(r'wf_nb/\w+\.py', rel): return f'src/{rel}.html' + (f'#L-{line}' if line else '')
    return f'src/{rel}'

def _source_link(obj) -> str:
    import inspect
    try:
        f = Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve(); line = inspect.getsourcelines(inspect.unwrap(obj))[1]
        rel = str(f.relative_to(ROOT))
    except Exception: return ''
    return f'<a class="srclink" href="{source_href(rel, line)}">source</a>'

def param_table(obj) -> str:
    "An HTML table of `obj`'s parameters (type and default), for what nbdev's show_doc documents without one (no docments)."
    import inspect
    try: sig = inspect.signature(obj)
    except (TypeError, ValueError): return ''
    star = {inspect.Parameter.VAR_POSITIONAL: '*', inspect.Parameter.VAR_KEYWORD: '**'}
    rows = []
    for n, prm in sig.parameters.items():
        if n in ('self', 'cls'): continue
        ann = '' if prm.annotation is prm.empty else prm.annotation if isinstance(prm.annotation, str) else getattr(prm.annotation, '__name__', str(prm.annotation))
        dflt = '' if prm.default is prm.empty else repr(prm.default)
        rows.append(f'<tr><td><code>{star.get(prm.kind, "")}{html.escape(n)}</code></td><td>{html.escape(str(ann))}</td>'
                    f'<td>{"<code>" + html.escape(dflt) + "</code>" if dflt else ""}</td></tr>')
    if not rows: return ''
    return ('<table class="params"><thead><tr><th>Parameter</th><th>Type</th><th>Default</th></tr></thead><tbody>'
            + ''.join(rows) + '</tbody></table>')

def _procs():
    from nbdev.processors import FilterDefaults, exec_show_docs, Processor, _default_exp, _show_docs
    from nbdev.showdoc import show_doc

    class show_docs_from_lib(Processor):
        "nbdev's `exec_show_docs`, evaluated against the exported module instead of a kernel replaying the notebook."
        def begin(self):
            mod = _default_exp(self.nb)
            self.ns = dict(vars(importlib.import_module('wf_nb' if mod in (None, '__init__') else f'wf_nb.{mod}')))
            self.ns['show_doc'] = show_doc
        def __call__(self, cell):
            if cell.cell_type != 'code' or not cell.source or not _show_docs(cell.parsed_()): return
            body = '\n'.join(l for l in cell.source.splitlines() if not l.startswith('#|'))
            try: md = eval(body.strip(), self.ns)._repr_markdown_()
            except Exception as e:   # fastcore cannot parse some sources (e.g. an indented multi-line signature): fall back
                md = _plain_doc(body.strip(), self.ns)
                print(f"  {Path(str(getattr(self.nb, 'path_', ''))).name}: {body.strip()}: plain signature "
                      f"({type(e).__name__}: {str(e).splitlines()[0][:80]})", file=sys.stderr)
            obj = _shown_obj(body.strip(), self.ns)
            md = re.sub(r'\[source\]\([^)]*\)(\{[^}]*\})?', lambda m: _source_link(obj), md, count=1)
            if obj is not None and '**Details**' not in md and '**Type**' not in md: md += '\n\n' + param_table(obj)
            cell.outputs = [{'output_type': 'display_data', 'metadata': {}, 'data': {'text/markdown': md}}]

    class Procs(FilterDefaults):
        def base_procs(self):
            return [show_docs_from_lib if p is exec_show_docs else p for p in super().base_procs()]
    return Procs()

def _split_title_cell(nb):
    "nbdev takes the first markdown cell as front matter (`# title`, `> summary`); keep what follows them as prose."
    from execnb.nbio import mk_cell
    for i, c in enumerate(nb.cells):
        if c.cell_type != 'markdown': continue
        m = re.match(r'\s*#\s+[^\n]+\n+(?:>[^\n]*\n?)*', c.source)
        if m and c.source[m.end():].strip():
            rest = c.source[m.end():]
            c.source = c.source[:m.end()].strip()
            nb.cells.insert(i + 1, mk_cell(rest.strip(), 'markdown'))
        return

def process(nb_path: Path, executed: Path | None = None, quarto: bool = False):
    "`(notebook, front matter)`: the notebook (its executed copy when given) after nbdev's docs processors."
    from execnb.nbio import read_nb
    nb = read_nb(executed or nb_path)
    nb.path_ = str(nb_path)
    _split_title_cell(nb)
    proc = _procs().nb_proc(nb)
    proc.process()
    nb = proc.nb
    fm = dict(getattr(nb, 'frontmatter_', {}) or {})
    if quarto: return nb, fm                     # Quarto reads the front matter cell and the `#| echo: false` directives
    cells = []
    for c in nb.cells:
        if c.get('source') is None or c.cell_type == 'raw': continue
        if 'injected-parameters' in c.get('metadata', {}).get('tags', []): continue   # papermill's (a test's tmp paths)
        if c.cell_type == 'code':
            outs = []
            for o in c.get('outputs', []):       # progress-bar debris (a final tqdm line) is not part of the page
                if o.get('output_type') == 'stream':
                    o['text'] = PROGRESS_LINE.sub('', ''.join(o['text'])).replace('\n\n', '\n').lstrip('\n')
                    if not o['text'].strip(): continue
                outs.append(o)
            c.outputs = outs
        if c.cell_type == 'code':                # nbconvert: directives become tags its TagRemovePreprocessor knows
            dirs = dict(re.findall(r'^#\|\s*([\w-]+):\s*(.*)$', c.source, re.M))
            c.source = '\n'.join(l for l in c.source.splitlines() if not l.startswith('#|')).strip()
            tags = []
            if dirs.get('echo') == 'false' or not c.source: tags.append('remove_input')
            if dirs.get('output') == 'false': tags.append('remove_output')
            c.metadata = {'tags': tags}
            if not c.source and not c.get('outputs'): continue
        elif not c.source.strip(): continue
        cells.append(c)
    nb.cells = cells
    return nb, fm

# ---------------------------------------------------------------- rendering
def _exporter():
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    c = Config()
    c.TagRemovePreprocessor.enabled = True
    c.TagRemovePreprocessor.remove_input_tags = {'remove_input'}
    c.TagRemovePreprocessor.remove_all_outputs_tags = {'remove_output'}
    c.HTMLExporter.exclude_anchor_links = False
    return HTMLExporter(config=c, template_name='basic')

def render_nb(nb) -> str:
    import nbformat
    d = json.loads(json.dumps(nb, default=lambda o: None))
    for c in d['cells']:
        for k in [k for k in c if k.endswith('_')]: c.pop(k)
        c.setdefault('metadata', {})
        if c['cell_type'] == 'code': c.setdefault('outputs', []); c.setdefault('execution_count', None)
    for k in [k for k in d if k.endswith('_')]: d.pop(k)
    from nbformat.v4.rwbase import rejoin_lines       # execnb saves multi-line outputs as lists of lines
    body, _ = _exporter().from_notebook_node(rejoin_lines(nbformat.from_dict(d)))
    return body

def inline_images(text: str, base: Path) -> str:
    "Markdown images with a relative path under `base` (README's, a report's) as inline data URIs: the site is one folder of pages."
    import base64, mimetypes
    def data(m):
        f = (base / m[2]).resolve()
        if m[2].startswith(('http:', 'https:', 'data:')) or not f.is_file(): return m[0]
        mime = mimetypes.guess_type(f.name)[0] or 'application/octet-stream'
        return f"![{m[1]}](data:{mime};base64,{base64.b64encode(f.read_bytes()).decode()})"
    return re.sub(r'!\[([^\]]*)\]\(([^)\s]+)\)', data, text)

def render_md(text: str) -> str:
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
    return _exporter().from_notebook_node(nb)[0]

def _links(body: str, doc_host: str) -> str:
    "nbdev's doc links point at `doc_host` and at lower-case anchors (Quarto's); on this site they are relative."
    body = body.replace(f'href="{doc_host.rstrip("/")}/', 'href="')
    from nbdev.config import get_config
    git = get_config(path=ROOT).get('git_url', '').rstrip('/')       # a placeholder: links into it go to the shipped source
    if git: body = re.sub(rf'href="{re.escape(git)}/(?:blob|tree)/[^/"]+/([^"#]+)(?:#L(\d+))?"',
                          lambda m: f'href="{source_href(m[1], int(m[2]) if m[2] else None)}"', body)
    body = re.sub(r'\{target="_blank"[^}]*\}', '', body).replace('#LNone"', '"')     # Quarto link attributes nbconvert shows as text
    body = re.sub(r'href="(?:\.\./)*papermill_runs/reports/([^"#]+?)\.(?:md|ipynb)"',   # README's links to a report: its page here
                  lambda m: f'href="{report_page_name(m[1])}"', body)
    ids = set(re.findall(r'\bid="([^"]+)"', body))
    def lower_anchor(m):
        low = m[2].lower()
        if low in ids: return m[0]
        ids.add(low); return f'<span id="{low}" class="anchor"></span>{m[0]}'
    body = re.sub(r'(<h[1-4][^>]*\bid="([^"]+)")', lower_anchor, body)
    return re.sub(r'href="([\w.-]+)\.ipynb(#[^"]*)?"', lambda m: f'href="{page_name(Path(m[1] + ".ipynb"))}{m[2] or ""}"', body)

def _text(body: str) -> str:
    t = re.sub(r'<(script|style)\b.*?</\1>', ' ', body, flags=re.S)
    return html.unescape(re.sub(r'\s+', ' ', re.sub(r'<[^>]+>', ' ', t))).strip()

def _headings(body: str, level: int = 2) -> list[tuple[str, str]]:
    out = []
    for m in re.finditer(rf'<h{level}[^>]*\bid="([^"]+)"[^>]*>(.*?)</h{level}>', body, flags=re.S):
        out.append((m[1], html.unescape(re.sub(r'<[^>]+>|¶', '', m[2])).strip()))
    return out

# ---------------------------------------------------------------- site pages
def readme_section(title_start: str) -> str:
    "The README section whose `## ` heading starts with `title_start` (heading included)."
    text = (ROOT / 'README.md').read_text()
    m = re.search(rf'^## {re.escape(title_start)}.*?(?=^## |\Z)', text, flags=re.M | re.S)
    return m[0].strip() if m else ''

def quality_chart(section: str) -> str:
    "README's quality table as a bar chart (a markdown image, inline PNG); '' when the table is not there."
    import base64, io
    rows = [[c.strip().strip('*').strip('`') for c in l.strip().strip('|').split('|')] for l in section.splitlines()
            if l.startswith('|') and not set(l) <= set('|-: ')]
    if len(rows) < 3: return ''
    head, arms, vals = rows[0], [], []
    for r in rows[1:]:
        try: v = [float(x.replace(',', '')) for x in r[1:len(head) - 1]]
        except ValueError: continue
        arms.append(r[0]); vals.append(v)
    if not arms: return ''
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 2.8))
    w = 0.8 / len(arms)
    for i, (a, v) in enumerate(zip(arms, vals)):
        ax.bar([j + i * w for j in range(len(v))], v, w, label=a[:60])
    ax.set_yscale('log'); ax.set_ylabel('perplexity (log)'); ax.set_xticks([j + w * (len(arms) - 1) / 2 for j in range(len(head) - 2)], head[1:-1])
    ax.legend(fontsize=7, frameon=False, loc='upper left', bbox_to_anchor=(1, 1)); ax.spines[['top', 'right']].set_visible(False)
    buf = io.BytesIO(); fig.savefig(buf, format='png', dpi=110, bbox_inches='tight'); plt.close(fig)
    return f"![held-out perplexity of each arm](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})"

def pipeline_md() -> str:
    "docs/pipeline.md with its `{{README: heading}}` lines replaced by README's sections (and the quality table charted)."
    src = (DOCS / 'pipeline.md').read_text()
    def section(m):
        sec = readme_section(m[1])
        return sec + ('\n\n' + quality_chart(sec) if m[1].startswith('Quality') else '')
    return re.sub(r'^\{\{README: (.+?)\}\}$', section, src, flags=re.M)

def report_page_name(rel: str) -> str:
    "The site page of the report at papermill_runs/reports/`rel` (without its suffix)."
    return 'report-' + re.sub(r'[^\w.-]+', '-', rel) + '.html'

def report_pages(log=print) -> list[dict]:
    "Pages for papermill_runs/reports/** (notebooks and markdown) and for the benchmark scripts."
    pages = []
    rep = ROOT / 'papermill_runs' / 'reports'
    for p in sorted(rep.rglob('*')) if rep.exists() else []:
        if p.suffix not in ('.ipynb', '.md') or any(s.startswith('.') for s in p.parts): continue
        rel = p.relative_to(rep)
        name = report_page_name(str(rel.with_suffix('')))
        if p.suffix == '.md':
            text = p.read_text(); m = re.search(r'^#\s+(.+)$', text, re.M)
            body = render_md(inline_images(text if m else f'# {rel.stem}\n\n{text}', p.parent)); title = m[1] if m else rel.stem
        else:
            import nbformat
            nb = nbformat.reads(p.read_text(), as_version=4)   # joins list-of-lines sources, as nbconvert expects strings
            for c in nb['cells']: c.setdefault('metadata', {})
            title = next((m[1] for c in nb['cells'] if c['cell_type'] == 'markdown'
                          for m in [re.search(r'^#\s+(.+)$', ''.join(c['source']), re.M)] if m), rel.stem)
            body = _exporter().from_notebook_node(nb)[0]
            if not re.search(r'<h1', body): body = f'<h1>{html.escape(title)}</h1>' + body
        pages.append(dict(name=name, title=title, summary=str(rel), body=body, group='Reports'))
    benches = sorted((ROOT / 'tests' / 'benchmarks').glob('*.py'))
    if benches:
        import ast
        parts = ['# Benchmarks and experiments\n\nEach script prints its tables; run it from the repository root. '
                 'The measured results are in the [Pipeline](pipeline.html) page and the notebooks.\n']
        for b in benches:
            doc = ast.get_docstring(ast.parse(b.read_text())) or ''
            parts.append(f"## `{b.name}`\n\n```bash\npython tests/benchmarks/{b.name}\n```\n\n{doc}\n")
        pages.append(dict(name='benchmarks.html', title='Benchmarks and experiments', summary='tests/benchmarks/*.py',
                          body=render_md('\n'.join(parts)), group='Reports'))
    return pages

# ---------------------------------------------------------------- layout
def _code(text: str) -> str: return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(text))

def layout(page: dict, pages: list[dict], site_title: str) -> str:
    groups = {}
    for p in pages: groups.setdefault(p['group'], []).append(p)
    nav = ''.join(f'<div class="nav-group"><div class="nav-title">{html.escape(g)}</div><ul>' + ''.join(
        f'<li><a href="{p["name"]}"{" class=current" if p is page else ""}>{_code(p["title"])}</a></li>' for p in ps)
        + '</ul></div>' for g, ps in groups.items())
    toc = ''.join(f'<li><a href="#{i}">{html.escape(t)}</a></li>' for i, t in _headings(page['body']))
    toc = f'<nav class="toc"><div class="nav-title">On this page</div><ul>{toc}</ul></nav>' if toc else ''
    i = next(k for k, p in enumerate(pages) if p is page)        # previous / next in the sidebar's reading order
    prev_, next_ = (pages[i - 1] if i > 0 else None), (pages[i + 1] if i + 1 < len(pages) else None)
    pager = '<nav class="pager" aria-label="previous and next page">' + (
        f'<a class="prev" rel="prev" href="{prev_["name"]}"><span>Previous</span>{_code(prev_["title"])}</a>' if prev_ else '<span></span>') + (
        f'<a class="next" rel="next" href="{next_["name"]}"><span>Next</span>{_code(next_["title"])}</a>' if next_ else '') + '</nav>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(page['title'].replace('`', ''))} - {html.escape(site_title)}</title>
<meta name="description" content="{html.escape(page.get('summary', ''))}">
<link rel="stylesheet" href="assets/site.css"></head>
<body>
<header class="top"><button class="menu" aria-label="menu" onclick="document.body.classList.toggle('nav-open')">&#9776;</button>
<a class="brand" href="index.html">{html.escape(site_title)}</a>
<div class="search"><input id="search" type="search" placeholder="Search the docs" aria-label="Search" autocomplete="off">
<div id="results" class="results" hidden></div></div></header>
<div class="wrap"><aside class="sidebar">{nav}</aside>
<main class="content">{page['body']}
{pager}
<footer class="foot">Built from the notebooks with nbdev's processors and nbconvert by <code>python docs/build.py</code>.</footer></main>
{toc}</div>
<script src="assets/search_index.js"></script><script src="assets/site.js"></script>
</body></html>"""

def fix_anchors(pages: list[dict]):
    "A link to `page.html#x` where the page has no `x` (nbdev links backticked private names too) goes to the page itself."
    ids = {p['name']: set(re.findall(r'\bid="([^"]+)"', p['body'])) for p in pages}
    def fix(m):
        page, frag = m[1], m[2]
        return m[0] if page not in ids or frag in ids[page] else f'href="{page}"'
    for p in pages: p['body'] = re.sub(r'href="([\w.-]+\.html)#([^"]+)"', fix, p['body'])

def unique_titles(pages: list[dict]):
    "Make page titles unique (the sidebar, the tab and the search show them): a repeated title gets its summary (the report's path)."
    seen = {}
    for p in pages: seen.setdefault(p['title'], []).append(p)
    for t, ps in seen.items():
        if len(ps) > 1:
            for p in ps: p['title'] = f"{t} ({p.get('summary') or p['name']})".replace('/report.ipynb', '').replace('.ipynb', '')

def ship_sources(dst: Path):
    "The files source links point to: the notebooks as they are, the library modules as highlighted pages with line anchors (`#L-12`)."
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    (dst / 'nbs').mkdir(parents=True); (dst / 'wf_nb').mkdir()
    for nb in (ROOT / 'nbs').glob('*.ipynb'): shutil.copy(nb, dst / 'nbs' / nb.name)
    for rel in LINKED - {f'nbs/{p.name}' for p in (ROOT / 'nbs').glob('*.ipynb')}:   # other files a page links to (raw)
        if not re.fullmatch(r'wf_nb/\w+\.py', rel) and (ROOT / rel).is_file() and '..' not in rel:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copy(ROOT / rel, dst / rel)
    fmt = HtmlFormatter(style='friendly', linenos='table', lineanchors='L', anchorlinenos=True, full=False)
    css = fmt.get_style_defs('.highlight') + '\nbody{font-family:ui-monospace,monospace;font-size:13px;margin:1rem} .linenos a{color:#999}'
    for py in sorted((ROOT / 'wf_nb').glob('*.py')):
        code = highlight(py.read_text(), PythonLexer(), fmt)
        (dst / 'wf_nb' / f'{py.name}.html').write_text(f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>wf_nb/{py.name}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{css}</style></head><body>'
            f'<p><b>wf_nb/{py.name}</b> (generated from the notebooks by <code>nbdev_export</code>)</p>{code}</body></html>')

# ---------------------------------------------------------------- build
def build(out: Path, execute_which: str = 'all', jobs: int = 2, log=print) -> list[Path]:
    "Render every notebook, the landing/pipeline/report pages, the search index and assets into `out` (atomically)."
    sys.path.insert(0, str(ROOT))
    from nbdev.config import get_config
    cfg = get_config(path=ROOT)
    REPO_URL[1] = cfg.get('branch', 'main')
    nbs = sorted((ROOT / 'nbs').glob('*.ipynb'), key=lambda p: (p.stem != 'index', p.stem))
    executed = _executed(nbs, execute_which, jobs, log)
    pages = []
    for p in nbs:
        nb, fm = process(p, executed.get(p))
        title = fm.get('title') or p.stem
        body = render_nb(nb)
        lead = _code(fm.get('description', ''))
        head = f'<h1>{_code(title)}</h1>' + (f'<p class="lead">{lead}</p>' if lead else '')
        if p.stem != 'index':
            head += (f'<p class="src">Source: <a href="{source_href("nbs/" + p.name)}"><code>nbs/{p.name}</code></a>'
                     + ('' if p in executed else ' (shown without running; build with <code>--execute</code> for outputs)') + '</p>')
        body = _links(head + body, cfg.doc_host)
        pages.append(dict(name=page_name(p), title=('Home' if p.stem == 'index' else title), summary=fm.get('description', ''),
                          body=body, group='Start' if p.stem == 'index' else 'Library'))
    pages.insert(1, dict(name='pipeline.html', title='The pipeline', summary='Stage 1 -> 1.9 -> 2 -> 3, with the measured tables',
                         body=_links(render_md(inline_images(pipeline_md(), ROOT)), cfg.doc_host), group='Start'))
    pages += report_pages(log)
    unique_titles(pages)
    fix_anchors(pages)
    cards = ''.join(f'<a class="card" href="{p["name"]}"><b>{_code(p["title"])}</b><span>{_code(p.get("summary", ""))}</span></a>'
                    for p in pages[1:])
    pages[0]['body'] += f'<h2 id="all-pages">All pages</h2><div class="cards">{cards}</div>'
    tmp = out.with_name(out.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True); (tmp / 'assets').mkdir(parents=True)
    for p in pages: (tmp / p['name']).write_text(layout(p, pages, cfg.title))
    if not REPO_URL[0]: ship_sources(tmp / 'src')
    index = [dict(u=p['name'], t=p['title'], s=p.get('summary', ''), h=[[i, t] for i, t in _headings(p['body'], 2) + _headings(p['body'], 3)],
                  x=_text(p['body'])[:40000]) for p in pages]
    (tmp / 'assets' / 'search_index.js').write_text('window.SEARCH_INDEX = ' + json.dumps(index) + ';\n')
    for a in ('site.css', 'site.js'): shutil.copy(DOCS / 'assets' / a, tmp / 'assets' / a)
    from pygments.formatters import HtmlFormatter
    (tmp / 'assets' / 'site.css').write_text((DOCS / 'assets' / 'site.css').read_text() + '\n' + HtmlFormatter(style='friendly').get_style_defs('.highlight'))
    shutil.rmtree(out, ignore_errors=True); tmp.rename(out)                    # never a half-built site
    return [out / p['name'] for p in pages]

def build_quarto(out: Path, execute_which: str = 'all', jobs: int = 2, log=print):
    "What `nbdev_docs` does (Quarto), with this file's processing: nbdev's quarto config, processed notebooks in _proc/, `quarto render`."
    from nbdev.quarto import refresh_quarto_yml, nbdev_sidebar
    from execnb.nbio import write_nb
    nbs = sorted((ROOT / 'nbs').glob('*.ipynb'))
    executed = _executed(nbs, execute_which, jobs, log)
    refresh_quarto_yml(); nbdev_sidebar(force=True)            # nbdev's _quarto.yml and sidebar.yml in nbs/
    proc = ROOT / '_proc'
    shutil.rmtree(proc, ignore_errors=True); proc.mkdir()
    for f in (ROOT / 'nbs').iterdir():
        if f.suffix in ('.yml', '.css', '.scss') or f.name == '_extensions':
            (shutil.copytree if f.is_dir() else shutil.copy)(f, proc / f.name)
    for p in nbs: write_nb(process(p, executed.get(p), quarto=True)[0], proc / p.name)
    (proc / 'pipeline.md').write_text(pipeline_md())
    subprocess.run(['quarto', 'render', str(proc), '--output-dir', str(Path(out).resolve())], check=True, cwd=proc)

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default=str(DOCS / '_site'))
    ap.add_argument('--execute', default='all', help="'all' (default), 'none', or notebook names, comma-separated")
    ap.add_argument('--jobs', type=int, default=2, help='notebooks executed at once')
    ap.add_argument('--renderer', choices=['auto', 'nbconvert', 'quarto'], default='auto',
                    help='auto: quarto when it is on PATH, else nbconvert')
    ap.add_argument('--exec-one', nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.exec_one: return _exec_child(*a.exec_one)
    t0 = time.time()
    if a.renderer == 'quarto' or (a.renderer == 'auto' and shutil.which('quarto')):
        build_quarto(Path(a.out), a.execute, a.jobs); print(f"built the Quarto site in {a.out}"); return
    pages = build(Path(a.out), a.execute, a.jobs)
    print(f"built {len(pages)} pages in {a.out} in {time.time() - t0:.0f}s")

if __name__ == '__main__':
    main()
