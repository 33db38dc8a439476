"""Tiny training script for tests/test_multiprocess.py: run it plainly (1 process) or under
`accelerate launch --num_processes N --cpu` / `torchrun` (N processes, gloo).

It trains `tiny_llama` with `wf_nb.trainer.Trainer` on a deterministic in-memory stream sharded by rank. The stream's
position counts *global* rows (like `wf_nb.stream.TokenStream`), so the union of the ranks' batches at step t equals
the 1-process batch at step t when `batch_size * world_size` is the same, and a checkpoint's data state is valid
at any world size. `--die-at STEP` makes every rank SIGKILL itself while computing step STEP+1 (a crash with no
chance to save). `--sigint-at STEP` sends SIGINT to rank 0 only, as `wf cancel` does."""
import argparse, json, os, signal, sys
from pathlib import Path
import torch

class ShardedRows:
    "Endless stream over rows [N, S]; rank r of W takes rows [pos + r*b, pos + (r+1)*b) of each global step."
    def __init__(self, rows, batch_size, rank=0, world_size=1):
        self.rows, self.b, self.rank, self.world, self.pos = rows, batch_size, rank, world_size, 0
    def __iter__(self): return self
    def __next__(self):
        start = self.pos + self.rank * self.b
        x = self.rows[[(start + i) % len(self.rows) for i in range(self.b)]]
        self.pos += self.b * self.world
        return {'input_ids': x, 'labels': x.clone()}
    def state_dict(self): return {'pos': self.pos}
    def load_state_dict(self, sd): self.pos = sd['pos']

def rows(n=96, seq_len=32, seed=0):
    "Structured rows (arithmetic progressions mod 300): the loss falls fast, so steps differ visibly."
    g = torch.Generator().manual_seed(seed)
    return (torch.arange(seq_len)[None] * torch.randint(1, 7, (n, 1), generator=g) + torch.randint(0, 90, (n, 1), generator=g)) % 300

def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument('--run-dir', required=True)
    p.add_argument('--batch-size', type=int, default=2, help='rows per process per step')
    p.add_argument('--max-steps', type=int, default=8)
    p.add_argument('--save-interval', type=int, default=3)
    p.add_argument('--die-at', type=int, default=-1)
    p.add_argument('--sigint-at', type=int, default=-1, help='rank 0 alone gets SIGINT at this step (what `wf cancel` sends)')
    p.add_argument('--strategy', default='ddp', help='distributed.strategy: ddp | fsdp (FSDP2)')
    p.add_argument('--ternary', action='store_true', help='train the ternary (BitLinear) model, compiled, 2 micro-batches a step')
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from wf_nb.config import get_config
    from wf_nb.assets import load_fp_model
    from wf_nb.trainer import Trainer, Callback
    from wf_nb.checkpoint import is_fsdp
    cfg = get_config([f'training.max_steps={a.max_steps}', f'training.batch_size={a.batch_size}', 'training.lr=5e-3',
                      f'training.save_interval={a.save_interval}', 'training.warmup_steps=0', 'training.spike_factor=0',
                      'logging.interval=1', 'logging.progress=false', 'logging.wandb_mode=disabled', 'data.seq_len=32',
                      f'distributed.strategy={a.strategy}',
                      *(['training.compile=true', 'training.grad_accum=2'] if a.ternary else ['quant.enabled=false'])],
                     model='tiny_llama')
    from wf_nb.launch import check_world
    acc = check_world(Accelerator(cpu=True))
    data = ShardedRows(rows(seq_len=cfg.data.seq_len), cfg.training.batch_size, acc.process_index, acc.num_processes)
    model = load_fp_model(cfg.model, seed=0)
    if a.ternary:
        from wf_nb.convert import convert
        model = convert(model, cfg.quant)
    class Faults(Callback):   # test-only fault injection, while step die_at+1 / sigint_at+1 computes its loss
        def after_loss(self, tr, loss):
            if tr.step == a.die_at: os.kill(os.getpid(), signal.SIGKILL)
            if tr.step == a.sigint_at and tr.acc.is_main_process: os.kill(os.getpid(), signal.SIGINT)
            return loss
    log = print if acc.is_main_process else (lambda *a, **k: None)
    from wf_nb.callbacks import QuantSchedule   # BitNet's lambda warm-up, as the stages add it
    tr = Trainer(cfg, model, data, a.run_dir, accelerator=acc, log=log, callbacks=[Faults(), *([QuantSchedule()] if a.ternary else [])])
    res = tr.fit()
    if acc.is_main_process:
        print('RESULT ' + json.dumps({**res, 'world_size': acc.num_processes, 'sharded': is_fsdp(tr.acc.unwrap_model(tr.model)),
                                      'codes_per_step': sorted({bool(getattr(m, 'codes_per_step', False)) for m in tr.model.modules() if hasattr(m, 'int_path')})}), flush=True)
    acc.wait_for_everyone()
    if acc.num_processes > 1: torch.distributed.destroy_process_group()
    return 0

if __name__ == '__main__': sys.exit(main())
