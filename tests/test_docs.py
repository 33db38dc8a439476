"""The docs site builds offline from the notebooks: one page per notebook, an index, API signatures rendered,
nbdev directives stripped."""
import re, subprocess, sys
from pathlib import Path
from conftest import ROOT

def test_docs_site_builds(tmp_path):
    out = tmp_path / 'site'
    r = subprocess.run([sys.executable, str(ROOT / 'docs' / 'build.py'), '--out', str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    nbs = sorted(p.stem for p in (ROOT / 'nbs').glob('*.ipynb') if p.stem != 'index')
    pages = {p.stem for p in out.glob('*.html')}
    assert set(nbs) <= pages and {'index', 'home'} <= pages, (nbs, pages)
    index = (out / 'index.html').read_text()
    for nb in nbs: assert f'href="{nb}.html"' in index, nb
    quant = (out / '01_quant.html').read_text()
    assert '<h4 id="lambda_at"><code>lambda_at</code>' in quant and 'warmup_steps' in quant   # show_doc of an export
    for p in out.glob('*.html'):
        assert not re.search(r'#\|\s*(export|hide|default_exp)', p.read_text()), f'{p.name} shows nbdev directives'
