"""Data benchmark: tokenization throughput vs a `datasets.map` baseline, and loader throughput vs training.

    python tests/benchmarks/bench_data.py [--corpus shakespeare] [--repeats 3] [--batches 3000]

Tokenization is measured per core: the Rust tokenizer's own thread pool is limited to one thread
(RAYON_NUM_THREADS=1, set before tokenizers is imported) and both pipelines run in one process; `wf_nb` with
`num_proc=2` is also shown (total and per core). The loader reads 4 x 128 batches from memory-mapped shards
through `get_data` (the trainer's path) and is compared with what Stage-2 training of SmolLM2-135M consumes on
this CPU (~200 tokens/s, bf16 autocast; design.md section 5). Medians over `--repeats` runs.
"""
import os
os.environ.setdefault('RAYON_NUM_THREADS', '1')
os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
import argparse, shutil, statistics, tempfile, time
from pathlib import Path


def median_time(fn, repeats):
    ts = []
    for _ in range(repeats):
        t = time.perf_counter(); out = fn(); ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--corpus', default='shakespeare')
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--batches', type=int, default=3000)
    ap.add_argument('--train-tps', type=float, default=200.0, help='tokens/s Stage-2 training consumes (real model, this CPU)')
    a = ap.parse_args()

    import datasets, numpy as np, torch
    from wf_nb.config import get_config
    from wf_nb.assets import load_tokenizer
    from wf_nb.data import text_source
    from wf_nb.shards import data_tokenize
    from wf_nb.stream import get_data
    datasets.disable_progress_bars()
    tok = load_tokenizer(get_config(model='tiny_llama').model)
    src = text_source(a.corpus)
    docs = list(src.iter_docs())
    n_chars = sum(map(len, docs))
    tmp = Path(tempfile.mkdtemp(prefix='wf_bench_data_'))
    rows = []
    try:
        # --- tokenization ---
        def ours(num_proc):
            out = tmp / f'tok{num_proc}'
            return data_tokenize(src, out, tok, num_proc=num_proc, overwrite=True, verbose=False)['n_tokens']
        ds = datasets.Dataset.from_dict({'text': docs})
        def baseline():
            r = ds.map(lambda b: tok(b['text'], add_special_tokens=False), batched=True, batch_size=256,
                       remove_columns=['text'], load_from_cache_file=False, keep_in_memory=True)
            return sum(len(x) for x in r['input_ids']) + len(docs)     # + EOS per document, as ours
        t_base, n_base = median_time(baseline, a.repeats)
        t1, n1 = median_time(lambda: ours(1), a.repeats)
        t2, n2 = median_time(lambda: ours(2), a.repeats)
        assert n1 == n2 == n_base, (n1, n2, n_base)
        rows.append(('tokenize: datasets.map(tokenizer, batched) [baseline]', 1, n_base / t_base, n_base / t_base, 1.0))
        rows.append(('tokenize: wf_nb data_tokenize -> shards, num_proc=1', 1, n1 / t1, n1 / t1, t_base / t1))
        rows.append(('tokenize: wf_nb data_tokenize -> shards, num_proc=2', 2, n2 / t2, n2 / t2 / 2, t_base / t2 / 2))

        # --- loader ---
        base = [f'data.source={a.corpus}', f'data.shards_dir={tmp / "cache"}', 'data.seq_len=128', 'training.batch_size=4']
        def loader(overrides, n):
            tk = tok
            if any(o.startswith('data.fim_rate') for o in overrides):
                import copy
                from wf_nb.stream import add_fim_tokens
                tk = copy.deepcopy(tok); add_fim_tokens(tk)
            s = get_data(get_config(base + overrides, model='tiny_llama'), tk, verbose=False)
            next(s)                                                       # build/open outside the timing
            def run():
                for _ in range(n): next(s)
                return n * 4 * 128
            return median_time(run, a.repeats)
        for name, ov, n in [('loader: get_data 4x128 from shards (main process)', [], a.batches),
                            ('loader: + doc_mask (4-D attention mask)', ['data.doc_mask=true'], a.batches // 3),
                            ('loader: + FIM rate 0.5', ['data.fim_rate=0.5'], a.batches // 3),
                            ('loader: mixture pretrain_phase1_mix (7 components)', ['data.mixture=pretrain_phase1_mix'], a.batches),
                            ('loader: num_workers=2, prefetch 2', ['data.num_workers=2'], a.batches),
                            ('loader: tokenize=on_the_fly (no shards)', ['data.tokenize=on_the_fly'], a.batches // 3)]:
            t, ntok = loader(ov, n)
            rows.append((name, 1 if 'workers' not in name else 3, ntok / t, None, (ntok / t) / a.train_tps))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\ncorpus: {a.corpus} ({len(docs)} documents, {n_chars / 1e6:.1f} M chars, {n1:,} tokens); "
          f"SmolLM2 tokenizer; torch {torch.__version__}, datasets {datasets.__version__}; {os.cpu_count()} CPU(s), "
          f"RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}; median of {a.repeats}\n")
    print('| what | processes | tokens/s | tokens/s per core | ratio |')
    print('|---|---|---|---|---|')
    for name, procs, tps, per_core, ratio in rows:
        ref = 'vs baseline per core' if name.startswith('tokenize') else f'vs training {a.train_tps:.0f} tok/s'
        print(f"| {name} | {procs} | {tps:,.0f} | {'' if per_core is None else f'{per_core:,.0f}'} | {ratio:,.2f}x {ref} |")


if __name__ == '__main__':
    main()
