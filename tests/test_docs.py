"""The docs site, built by `python docs/build.py` from the notebooks, opened in a real headless browser (Debian's
`chromium` + `chromium-driver`, driven by selenium): every page is visited and the test fails on a broken internal
link (a missing page, a missing #anchor, a source link to a file the site does not ship), a link to the placeholder
repository of settings.ini, a missing image, a page without an H1, a JavaScript error, a repeated page title, a page
without previous/next links, or a page that scrolls sideways at phone width. Each page of a notebook with printing or
plotting cells must show outputs. It types into the search box, checks the copy buttons, and saves screenshots of the
landing page, a stage page and the API page at 1280 px and at phone width (`docs/_site/_screenshots/` when run as
`python tests/test_docs.py`, the test's tmp dir under pytest).

The pages come from executed notebooks: tests/test_notebooks.py (and test_jupyter.py for the tutorial) keep each
executed notebook in docs/_cache/, and conftest.py runs this test after them, so nothing is executed twice in CI. Run
alone, the build executes what the cache lacks (`WF_DOCS_EXECUTE=index,08a_lmeval` executes only those, for a quick look:
the outputs check then covers those pages only)."""
import json, os, re, shutil, subprocess, sys, tempfile
from pathlib import Path
from urllib.parse import urlparse, unquote
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXECUTE = os.environ.get('WF_DOCS_EXECUTE', 'all')
CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
DRIVER = shutil.which('chromedriver') or '/usr/bin/chromedriver'

def build_site(out: Path, execute=EXECUTE) -> subprocess.CompletedProcess:
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'WANDB_MODE': 'disabled'}
    return subprocess.run([sys.executable, str(ROOT / 'docs' / 'build.py'), '--out', str(out), '--execute', execute],
                          capture_output=True, text=True, timeout=900 if execute != 'all' else 5400, env=env, cwd=ROOT)

def browser(user_data_dir):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for f in ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
              '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage', f'--user-data-dir={user_data_dir}'):
        o.add_argument(f)
    o.set_capability('goog:loggingPrefs', {'browser': 'ALL'})
    return webdriver.Chrome(service=Service(DRIVER), options=o)

PAGE_FACTS = """return {
  h1: Array.from(document.querySelectorAll('h1')).map(h => h.textContent.trim()),
  ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
  links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
  images: Array.from(document.images).map(i => ({src: i.src.slice(0, 80), ok: i.complete && i.naturalWidth > 0})),
  overflow: document.documentElement.scrollWidth - window.innerWidth,
  title: document.title, pager: Array.from(document.querySelectorAll('.pager a')).map(a => a.rel),
  copy: document.querySelectorAll('button.copy').length,
  outputs: document.querySelectorAll('.output_subarea:not(.output_markdown)').length };"""

def check_site(site: Path, shots: Path) -> dict:
    "Visit every page of `site`; returns `{problems: [...], pages: n, ...}`; saves landing screenshots into `shots`."
    from selenium.webdriver.common.by import By
    pages = sorted(p.name for p in site.glob('*.html'))
    problems, facts = [], {}
    with tempfile.TemporaryDirectory() as profile:
        d = browser(profile)
        try:
            d.set_window_size(1280, 900)
            for name in pages:
                d.get((site / name).as_uri())
                facts[name] = f = d.execute_script(PAGE_FACTS)
                errors = [e['message'] for e in d.get_log('browser') if e['level'] == 'SEVERE']
                problems += [f"{name}: JavaScript error: {m}" for m in errors]
                if not f['h1'] or not f['h1'][0]: problems.append(f"{name}: no H1")
                problems += [f"{name}: image does not load: {i['src']}" for i in f['images'] if not i['ok']]
            titles = {}
            for name, f in facts.items(): titles.setdefault(f['title'], []).append(name)
            problems += [f"pages with the same title {t!r}: {ns}" for t, ns in titles.items() if len(ns) > 1]
            problems += [f"{name}: no previous/next links" for name, f in facts.items() if not f['pager']]
            git = placeholder_repo()
            for name, f in facts.items():              # internal links: the page exists and holds the anchor
                for href in f['links']:
                    u = urlparse(href)
                    if git and href.startswith(git): problems.append(f"{name}: links to the placeholder repository: {href}")
                    if u.scheme != 'file': continue
                    target = Path(unquote(u.path))
                    if not target.exists() or site.resolve() not in target.resolve().parents:
                        problems.append(f"{name}: broken link {href}"); continue
                    ids = set(facts[target.name]['ids']) if target.name in facts else set(re.findall(r'\bid="([^"]+)"', target.read_text(errors='replace')))
                    if u.fragment and target.suffix == '.html' and not {u.fragment, unquote(u.fragment)} & ids:
                        problems.append(f"{name}: link to a missing anchor {target.name}#{u.fragment}")
            # the search box finds a function and links to its reference
            d.get((site / 'index.html').as_uri())
            box = d.find_element(By.ID, 'search'); box.send_keys('lambda_at')
            hits = [a.get_attribute('href') for a in d.find_elements(By.CSS_SELECTOR, '#results a')]
            if not any('quant.html' in h for h in hits): problems.append(f"search for lambda_at found {hits}")
            box.clear(); d.execute_script("document.getElementById('results').hidden = true")
            shots.mkdir(parents=True, exist_ok=True)
            for name in SHOTS:
                d.get((site / f'{name}.html').as_uri()); d.save_screenshot(str(shots / f'{name}-desktop.png'))
            d.set_window_size(390, 844)                # a phone: no page scrolls sideways
            for name in pages:
                d.get((site / name).as_uri())
                phone = d.execute_script(PAGE_FACTS)
                if phone['overflow'] > 4: problems.append(f"{name} at phone width scrolls sideways by {phone['overflow']}px")
                if name[:-5] in SHOTS: d.save_screenshot(str(shots / f'{name[:-5]}-phone.png'))
            problems += [f"phone: JavaScript error: {e['message']}" for e in d.get_log('browser') if e['level'] == 'SEVERE']
        finally:
            d.quit()
    return dict(problems=problems, pages=len(pages), facts=facts)

SHOTS = ('index', 'stages', 'api')            # the landing page, a stage page and the API page

def placeholder_repo() -> str:
    "settings.ini's git_url (a placeholder): nothing on the site may link into it."
    from nbdev.config import get_config
    return get_config(path=ROOT).get('git_url', '').rstrip('/')

def _shown(cell) -> bool:
    "A code cell the page shows with its outputs (not exported-only, hidden, skipped by the test flags or output: false)."
    src = ''.join(cell['source'])
    dirs = re.findall(r'^#\|\s*([\w-]+:?)\s*(.*)$', src, re.M)
    keys = {k.rstrip(':') for k, _ in dirs}
    return cell['cell_type'] == 'code' and not keys & {'export', 'exports', 'hide', 'slow', 'cuda', 'exporti'} and \
        ('output', 'false') not in [(k.rstrip(':'), v.strip()) for k, v in dirs] and ('eval', 'false') not in [(k.rstrip(':'), v.strip()) for k, v in dirs]

def prints_or_plots(nb_path: Path) -> bool:
    "Whether a notebook has a shown cell that prints, displays or plots, or ends in a bare name (its value is shown)."
    for c in json.loads(nb_path.read_text())['cells']:
        if not _shown(c): continue
        src = ''.join(c['source'])
        lines = [l for l in src.splitlines() if l.strip() and not l.lstrip().startswith('#')]
        if re.search(r'^\s*(print|display)\(|\bplt\.|\.plot\(', src, re.M) or (lines and re.fullmatch(r'[A-Za-z_]\w*(\[[^\]]*\])?', lines[-1].strip())):
            return True
    return False

@pytest.fixture(scope='module')
def site(module_tmp):
    out = module_tmp('docs') / 'site'
    r = build_site(out)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out

def test_every_notebook_is_a_page(site):
    from nbdev.frontmatter import _nbpath2html
    nbs = sorted((ROOT / 'nbs').glob('*.ipynb'))
    pages = {p.name for p in site.glob('*.html')}
    want = {_nbpath2html(p).name for p in nbs} | {'index.html', 'pipeline.html', 'benchmarks.html'}
    assert want <= pages, want - pages
    index = (site / 'index.html').read_text()
    assert 'Quick start' in index and 'pip install' in re.sub(r'<[^>]+>', '', index)                           # the landing page has the quick start
    for p in nbs: assert f'href="{_nbpath2html(p).name}"' in index, p                  # and every notebook in its nav
    pipe = (site / 'pipeline.html').read_text()
    assert all(f'Stage {s}' in pipe for s in ('1', '1.9', '2', '3')) and 'naive ternary QAT' in pipe   # README's measured table
    assert 'href="papermill_runs/reports/' not in pipe and 'href="report-generality_log.html"' in pipe   # README's report links: their pages
    assert 'alt="held-out perplexity / teacher against student tokens" src="data:image/png;base64,' in pipe   # README's token curve, inlined

def _shows_output(page: str) -> bool:
    "Whether a page shows a cell's output other than markdown: printed text, a value, or a plot (`output_png output_subarea`)."
    return any('output_markdown' not in c for c in re.findall(r'class="([^"]*\boutput_subarea\b[^"]*)"', page))

def test_every_printing_notebook_shows_outputs(site):
    "The page of each notebook that prints or plots shows outputs (it was built from the notebook executed in a kernel)."
    from nbdev.frontmatter import _nbpath2html
    names = None if EXECUTE == 'all' else set(EXECUTE.split(','))
    missing = []
    for p in sorted((ROOT / 'nbs').glob('*.ipynb')):
        if names is not None and p.stem not in names: continue
        page = (site / _nbpath2html(p).name).read_text()
        if 'shown without running' in page and any(_shown(c) for c in json.loads(p.read_text())['cells']): missing.append(p.name)
        elif prints_or_plots(p) and not _shows_output(page): missing.append(p.name)
    assert not missing, f'pages of notebooks with code that were not built from the executed notebook, or show none of its outputs: {missing}'

def test_sources_shipped_and_linked(site):
    "Source links go to files the site ships (the notebook; the module at the line) and never to the placeholder repository."
    quant = (site / 'quant.html').read_text()
    assert 'href="src/nbs/01_quant.ipynb"' in quant and (site / 'src' / 'nbs' / '01_quant.ipynb').exists()
    m = re.search(r'href="(src/wf_nb/quant\.py\.html)#L-(\d+)"', quant)
    assert m and f'id="L-{m[2]}"' in (site / m[1]).read_text(), 'no source link to a line of the shipped module'
    git = placeholder_repo()
    assert not [p.name for p in site.glob('*.html') if git and git in p.read_text()]

def test_pages_show_api_reference_and_outputs(site):
    quant = (site / 'quant.html').read_text()
    assert 'id="lambda_at"' in quant and 'warmup_steps' in quant                       # nbdev's show_doc of an export
    assert not re.search(r'#\|\s*(export|hide|default_exp)', quant)                   # directives are not shown
    lme = (site / 'lmeval.html').read_text()
    assert 'id="run_lm_eval"' in lme and '<img' in lme and 'data:image/png' in lme      # executed: its plot is on the page
    assert 'max_abs_loglik_diff' in lme                                                 # and its printed outputs
    blk = quant[quant.index('id="lambda_at"'):][:4000]                                 # a parameter table for a documented function
    assert '<table class="params">' in blk and '<code>warmup_steps</code>' in blk, blk[:1500]
    assert 'DeprecationWarning' not in lme and 'recompile_limit' not in quant

@pytest.mark.skipif(not (Path(CHROMIUM).exists() and Path(DRIVER).exists()), reason='needs Debian chromium + chromium-driver')
def test_site_in_a_browser(site, tmp_path):
    res = check_site(site, tmp_path / 'shots')
    assert res['pages'] >= 20
    assert not res['problems'], '\n'.join(res['problems'][:40])
    assert res['facts']['quant.html']['copy'] > 5, 'no copy buttons on the code blocks'
    for n in SHOTS:
        for w in ('desktop', 'phone'): assert (tmp_path / 'shots' / f'{n}-{w}.png').stat().st_size > 10_000

if __name__ == '__main__':       # build docs/_site, check it, keep the screenshots for a human look
    out = ROOT / 'docs' / '_site'
    if '--no-build' not in sys.argv:
        r = build_site(out, execute=sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith('-') else EXECUTE)
        print(r.stdout, r.stderr[-3000:])
    res = check_site(out, out / '_screenshots')
    print(f"{res['pages']} pages; problems:", *res['problems'] or ['none'], sep='\n  ')
