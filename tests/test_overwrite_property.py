"""Issue 34: a property test of every `--overwrite` output path of wf_nb. Random layouts of user files and folders,
runs folders with runs, source checkpoints and corpora, earlier wf_nb outputs (exports, token shards) (some with a user's file added since) and specs;
each output writer is pointed at a random path with `overwrite=True`. Whatever it does, every file it did not write
before (a user's file, a run, a source) is still there, byte for byte. A seeded loop (no extra dependency), ~1 s."""
import os, random
from pathlib import Path
import pytest
from wf_nb.io import OUTPUT_MARKER, atomic_dir, check_output, mark_output, OutputError
from wf_nb.export import _atomic_write, _check_out, ExportError
from wf_nb.cloud import LAUNCH_MARK, LaunchError, launch
from wf_nb.shards import data_tokenize
from wf_nb.data import DataError

@pytest.fixture(scope='module')
def tok():
    from wf_nb.assets import load_tokenizer
    from wf_nb.config import get_config
    return load_tokenizer(get_config(model='tiny_llama').model)

def _files(root: Path) -> dict:
    return {p: p.read_bytes() for p in root.rglob('*') if p.is_file() or p.is_symlink() and p.exists()}

def _layout(root: Path, rng: random.Random) -> list[Path]:
    "A random tree; returns candidate output paths (existing folders and files, new paths, parents)."
    cands = [root]
    for i in range(rng.randint(1, 3)):                                   # user folders, some nested
        d = root/f'user{i}'/('deep' if rng.random() < .5 else ''); d.mkdir(parents=True, exist_ok=True)
        for j in range(rng.randint(0, 3)): (d/f'f{j}.txt').write_text(f'user {i} {j}')
        cands += [d, d.parent, d/'new']
    for i in range(rng.randint(1, 2)):                                   # runs folders
        runs = root/f'runs{i}' if rng.random() < .7 else root/f'user0'/f'runs{i}'
        for k in range(rng.randint(1, 2)):
            r = runs/f'run{k}'; (r/'final').mkdir(parents=True, exist_ok=True)
            (r/'metadata.json').write_text('{"status": "COMPLETED"}'); (r/'final'/'model.safetensors').write_bytes(b'w' * 8)
            if rng.random() < .5: atomic_dir(r/'export', lambda t: ((t/'config.json').write_text('{}'), mark_output(t, 'export')))
            cands += [r, r/'final', r/'export', r/'final'/'x']
        cands += [runs, runs.parent]
    for i in range(rng.randint(1, 3)):                                   # earlier wf_nb outputs, some touched by a user since
        o = root/f'out{i}'
        atomic_dir(o, lambda t: ((t/'model.safetensors').write_bytes(b'old'), (t/'sub').mkdir(), (t/'sub'/'a.json').write_text('{}'),
                                 mark_output(t, 'export')))
        if rng.random() < .4: (o/('sub' if rng.random() < .5 else '.')/'mine.txt').write_text('added by the user')
        cands += [o, o/'sub']
    (root/'corpus').mkdir(); (root/'corpus'/'a.txt').write_text('To be, or not to be: that is the question. ' * 20)
    cands += [root/'corpus', root/'corpus'/'tok', root/'shards']
    spec = root/'spec'; spec.mkdir()
    (spec/'run.sh').write_text(f'#!/bin/sh\n# {LAUNCH_MARK}: written by wf launch\n' if rng.random() < .5 else '#!/bin/sh\necho mine\n')
    cands += [spec, root/'empty']; (root/'empty').mkdir()
    return cands

def _writers(src: Path, corpus: Path, tok):
    "Each output path of wf_nb with overwrite on, as `(name, fn(out))`."
    def export_dir(out): _check_out(out, True, src); _atomic_write(out, lambda t: (t/'model.safetensors').write_bytes(b'new'), overwrite=True)
    def export_file(out): _check_out(out/'model.gguf', True, src, file_mark=b'wf_nb.hidden_act')
    def spec(out): launch('local', 'tiny_llama', out=out, dry_run=True, overwrite=True, log=lambda *a: None)
    def generic(out):
        if check_output(out, True, protect=[('the source', src)]) or not out.exists():
            atomic_dir(out, lambda t: ((t/'x').write_text('new'), mark_output(t, 'test')), exists='replace')
    def tokenize(out): data_tokenize(str(corpus), out, tok, overwrite=True, verbose=False)
    return [('export', export_dir), ('gguf', export_file), ('launch', spec), ('io', generic), ('tokenize', tokenize)]

def _allowed_gone(before: dict, out: Path) -> set:
    "Files a replace of `out` may remove: those the marker of `out` lists (what wf_nb wrote), or a marked spec."
    out = out.resolve()
    m = out/OUTPUT_MARKER
    if m.is_file():
        import json
        listed = {out/f for f in json.loads(m.read_text())['files']} | {m}
        return {p for p in before if p.resolve() in listed}
    return set()

@pytest.mark.parametrize('seed', range(12))
def test_overwrite_never_deletes_what_wf_nb_did_not_write(tmp_path, seed, tok):
    rng = random.Random(seed)
    root = tmp_path/'t'; root.mkdir()
    cands = _layout(root, rng)
    data_tokenize(str(root/'corpus'), root/'shards', tok, verbose=False)                 # an earlier wf_nb shard folder
    if rng.random() < .4: (root/'shards'/'notes.txt').write_text('added by the user')
    src = root/'runs0'/'run0'/'final'
    for name, fn in _writers(src, root/'corpus', tok):
        for out in rng.sample(cands, min(6, len(cands))):
            before = _files(root)
            may_go = _allowed_gone(before, out)
            try: fn(out)
            except (OutputError, ExportError, LaunchError, DataError): pass
            after = _files(root)
            for p, b in before.items():
                if p in may_go or (name == 'launch' and p == out/'run.sh' and LAUNCH_MARK.encode() in b): continue
                assert after.get(p) == b, f"seed {seed}: {name} --overwrite into {out.relative_to(tmp_path)} changed {p.relative_to(tmp_path)}"
            if name in ('export', 'io') and out.resolve() == src.resolve(): assert src.exists()
