"""Memory and time of the LM loss with full logits (`lm_loss`) vs `chunked_lm_loss` (training.loss_chunk).

One row of `n` tokens, hidden size `d`, vocabulary `V` (SmolLM2's 49152 by default): forward + backward from the
final hidden states through the output projection to the loss. Each point runs in a fresh subprocess; memory is
the growth of the process's peak RSS during the step (beyond the inputs and weights), time the median CPU time
of `--reps` steps after a warm-up.

    python tests/benchmarks/bench_loss.py                          # n = 2048, 8192, 16384; chunk 4096
    python tests/benchmarks/bench_loss.py --lengths 4096 --chunk 1024
"""
import argparse, json, resource, statistics, subprocess, sys, time


def _point(kind, n, d, V, chunk, reps):
    import torch
    import torch.nn.functional as F
    from wf_nb.losses import lm_loss, chunked_lm_loss
    torch.set_num_threads(1); torch.manual_seed(0)
    h = torch.randn(1, n, d, requires_grad=True)
    W = (torch.randn(V, d) * 0.02).requires_grad_()
    y = torch.randint(0, V, (1, n))
    def step():
        h.grad = W.grad = None
        res = lm_loss(F.linear(h, W), y) if kind == 'full' else chunked_lm_loss(h, W, y, chunk)
        res['loss'].backward()
        return float(res['loss'])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loss = step()
    mem = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    cpu = []
    for _ in range(reps):
        c0 = time.process_time(); step(); cpu.append(time.process_time() - c0)
    return dict(kind=kind, n=n, mem_mb=mem, time=statistics.median(cpu), loss=loss)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--lengths', type=int, nargs='+', default=[2048, 8192, 16384])   # full logits at 32768: ~20 GB peak
    ap.add_argument('--d', type=int, default=64)
    ap.add_argument('--vocab', type=int, default=49152)
    ap.add_argument('--chunk', type=int, default=4096)
    ap.add_argument('--reps', type=int, default=2)
    ap.add_argument('--point', help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.point:
        kind, n = a.point.split(':')
        print('POINT ' + json.dumps(_point(kind, int(n), a.d, a.vocab, a.chunk, a.reps))); return
    rows = {}
    for n in a.lengths:
        for kind in ('full', 'chunked'):
            r = subprocess.run([sys.executable, __file__, '--point', f'{kind}:{n}', '--d', str(a.d), '--vocab', str(a.vocab),
                                '--chunk', str(a.chunk), '--reps', str(a.reps)], capture_output=True, text=True)
            line = [l for l in r.stdout.splitlines() if l.startswith('POINT ')]
            rows[kind, n] = json.loads(line[0][6:]) if line else {'error': r.stderr[-300:]}
            print(kind, n, rows[kind, n], flush=True)
    print(f"\nd={a.d}, vocab={a.vocab}, chunk={a.chunk}, 1 thread\n")
    print('| tokens | full: peak MB | chunked: peak MB | memory ratio | full: CPU s | chunked: CPU s | time ratio | same loss |')
    print('|---|---|---|---|---|---|---|---|')
    for n in a.lengths:
        f, c = rows['full', n], rows['chunked', n]
        if 'error' in f or 'error' in c: print(f'| {n} | {f.get("error", "")[:60]} | {c.get("error", "")[:60]} |'); continue
        print(f"| {n} | {f['mem_mb']:.0f} | {c['mem_mb']:.0f} | {f['mem_mb'] / max(c['mem_mb'], 1):.1f}x | {f['time']:.2f} | "
              f"{c['time']:.2f} | {c['time'] / f['time']:.2f}x | {abs(f['loss'] - c['loss']) < 1e-3 * abs(f['loss'])} |")


if __name__ == '__main__':
    main()
