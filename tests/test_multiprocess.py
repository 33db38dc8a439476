"""Multi-process training on 2 CPU processes (gloo), end to end: `accelerate launch` / `torchrun` of
tests/mp_train.py, which trains tiny_llama with wf_nb.trainer.Trainer on a rank-sharded deterministic stream.

(a) 2 processes at batch b == 1 process at batch 2b (same global batch, same rows), loss per step;
(b) a 2-process run whose processes are SIGKILLed mid-run resumes from its last checkpoint and ends with the
    per-step losses of the uninterrupted run;
(c) a checkpoint written at world size 2 reloads at world size 1 and continues with the same losses;
(d) `wf cancel` (SIGINT to rank 0 only) stops every rank cleanly with a checkpoint, and the run resumes exactly;
(e) the same with FSDP2 (`distributed.strategy=fsdp`, sharded by `wf_nb.trainer.shard_model` on CPU): 2 sharded
    processes match 1 process, a killed sharded run resumes exactly, its checkpoint reloads unsharded at world size
    1, and a DDP checkpoint reloads into a sharded run;
(f) the compiled ternary model with gradient accumulation, sharded over 2 processes, matches 1 process.
One module-scoped set of runs serves (a)-(c) (5 runs, about 2 minutes on 2 busy cores); (d) adds 2 runs, (e) 5, (f) 2."""
import inspect, json, os, shutil, subprocess, sys
from pathlib import Path
import pytest
from conftest import ROOT
from wf_nb.launch import free_port

SCRIPT = ROOT/'tests'/'mp_train.py'
STEPS, SAVE, DIE = 8, 3, 4   # checkpoints at 3, 6, 8; the killed run dies computing step 5 (last checkpoint: 3)
TOL = 1e-4                   # fp32 gloo all-reduce vs one process: observed ~1e-6

def _env():
    return {**os.environ, 'WANDB_MODE': 'disabled', 'OMP_NUM_THREADS': '1', 'TOKENIZERS_PARALLELISM': 'false'}

def accelerate_cmd(n):
    # --multi_gpu is accelerate's torchrun-based launcher; without GPUs the processes use CPU + gloo
    # (`--cpu --num_processes 2` would start a single process: accelerate's CPU launcher is mpirun).
    return [sys.executable, '-m', 'accelerate.commands.launch', '--multi_gpu', '--num_processes', str(n), '--num_machines', '1',
            '--mixed_precision', 'no', '--dynamo_backend', 'no', '--main_process_port', str(free_port()), str(SCRIPT)]

def torchrun_cmd(n):
    return [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1', '--nproc_per_node', str(n),
            '--master_port', str(free_port()), str(SCRIPT)]

def run(cmd, run_dir, batch, *extra, check=True, timeout=240):
    full = [*cmd, '--run-dir', str(run_dir), '--batch-size', str(batch), '--max-steps', str(STEPS), '--save-interval', str(SAVE), *map(str, extra)]
    p = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try: out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()  # the launcher's agent SIGTERMs its workers (their own sessions), then SIGKILLs them
        try: p.communicate(timeout=60)
        except subprocess.TimeoutExpired: p.kill(); p.communicate()
        raise AssertionError(f"{' '.join(full)} did not finish in {timeout}s (a deadlock between ranks?)")
    r = subprocess.CompletedProcess(full, p.returncode, out, err)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    res = [json.loads(l[7:]) for l in r.stdout.splitlines() if l.startswith('RESULT ')]
    return r, (res[0] if res else None)

def losses(run_dir):
    return {r['step']: r['loss'] for r in map(json.loads, Path(run_dir, 'metrics.jsonl').read_text().splitlines()) if 'loss' in r}

def accuracies(run_dir):
    return {r['step']: r['accuracy'] for r in map(json.loads, Path(run_dir, 'metrics.jsonl').read_text().splitlines()) if 'accuracy' in r}

def assert_close(a: dict, b: dict, tol=TOL):
    assert list(a) == list(b), (list(a), list(b))
    bad = {k: (a[k], b[k]) for k in a if abs(a[k] - b[k]) > tol * max(1.0, abs(b[k]))}
    assert not bad, f"losses differ at steps {bad}"

@pytest.fixture(scope='module')
def runs(module_tmp):
    d = module_tmp('mp')
    out = {}
    out['one'] = run([sys.executable, str(SCRIPT)], d/'one', 4)[1]                 # 1 process, batch 4
    out['two'] = run(accelerate_cmd(2), d/'two', 2)[1]                             # 2 processes, batch 2 each
    r, _ = run(accelerate_cmd(2), d/'killed', 2, '--die-at', DIE, check=False)       # every rank SIGKILLed at step 5
    out['killed_rc'], out['killed_ckpts'] = r.returncode, sorted(p.name for p in (d/'killed'/'checkpoints').glob('step_*'))
    out['killed_steps'] = sorted(losses(d/'killed'))
    shutil.copytree(d/'killed', d/'w1')                                           # the world-size-2 checkpoint, for (c)
    shutil.copytree(d/'killed', d/'ddp_to_fsdp')                                  # ... and for (e)
    out['resumed'] = run(torchrun_cmd(2), d/'killed', 2)[1]                        # same command again (torchrun this time)
    out['w1'] = run([sys.executable, str(SCRIPT)], d/'w1', 4)[1]                   # world size 1, batch 4, from step 3
    out['dir'] = d
    return out

def test_two_processes_match_one(runs):
    assert runs['one']['world_size'] == 1 and runs['two']['world_size'] == 2
    assert runs['one']['status'] == runs['two']['status'] == 'COMPLETED'
    assert runs['one']['tokens_seen'] == runs['two']['tokens_seen']                # same global batch
    a, b = losses(runs['dir']/'two'), losses(runs['dir']/'one')
    assert_close(a, b)
    assert b[STEPS] < b[1] - 0.5, b                                                  # it trains: the losses move
    # every logged term is reduced across ranks, not rank 0's share (here the token accuracy: global counts)
    assert_close(accuracies(runs['dir']/'two'), accuracies(runs['dir']/'one'), tol=0.02)   # a rare argmax flip at most

def test_killed_run_resumes(runs):
    assert runs['killed_rc'] != 0
    assert runs['killed_ckpts'] == ['step_00000003'], runs['killed_ckpts']
    assert runs['killed_steps'] == [1, 2, 3, 4], runs['killed_steps']                # step 5 never finished
    res = runs['resumed']
    assert res['status'] == 'COMPLETED' and res['start_step'] == 3 and res['world_size'] == 2, res
    assert_close(losses(runs['dir']/'killed'), losses(runs['dir']/'two'), tol=1e-6)  # same world size: exact

def test_world_size_2_checkpoint_reloads_at_1(runs):
    res = runs['w1']
    assert res['status'] == 'COMPLETED' and res['start_step'] == 3 and res['world_size'] == 1, res
    assert res['tokens_seen'] == runs['two']['tokens_seen']
    assert_close(losses(runs['dir']/'w1'), losses(runs['dir']/'two'))

def test_cancel_rank0_stops_all_ranks_and_resumes(runs, tmp_path):
    r, res = run(accelerate_cmd(2), tmp_path/'c', 2, '--sigint-at', DIE)
    assert res['status'] == 'INTERRUPTED' and res['step'] == DIE + 1, res
    assert (tmp_path/'c'/'checkpoints'/f'step_{DIE + 1:08d}').exists()
    _, res = run(torchrun_cmd(2), tmp_path/'c', 2)
    assert res['status'] == 'COMPLETED' and res['start_step'] == DIE + 1, res
    assert_close(losses(tmp_path/'c'), losses(runs['dir']/'two'), tol=1e-6)


@pytest.fixture(scope='module')
def fsdp_runs(runs):
    d, out = runs['dir'], {}
    out['two'] = run(accelerate_cmd(2), d/'fsdp_two', 2, '--strategy', 'fsdp')[1]
    r, _ = run(accelerate_cmd(2), d/'fsdp_killed', 2, '--strategy', 'fsdp', '--die-at', DIE, check=False)
    out['killed_rc'], out['killed_ckpts'] = r.returncode, sorted(p.name for p in (d/'fsdp_killed'/'checkpoints').glob('step_*'))
    shutil.copytree(d/'fsdp_killed', d/'fsdp_w1')
    out['resumed'] = run(torchrun_cmd(2), d/'fsdp_killed', 2, '--strategy', 'fsdp')[1]
    out['w1'] = run([sys.executable, str(SCRIPT)], d/'fsdp_w1', 4)[1]                  # unsharded, world size 1
    out['from_ddp'] = run(torchrun_cmd(2), d/'ddp_to_fsdp', 2, '--strategy', 'fsdp')[1] # DDP checkpoint -> FSDP2
    return out

def test_fsdp_two_processes_match_one(runs, fsdp_runs):
    res = fsdp_runs['two']
    assert res['sharded'] and res['world_size'] == 2 and res['status'] == 'COMPLETED', res
    assert not runs['one']['sharded'] and res['tokens_seen'] == runs['one']['tokens_seen']
    assert_close(losses(runs['dir']/'fsdp_two'), losses(runs['dir']/'one'))

def test_fsdp_killed_run_resumes_and_reloads_anywhere(runs, fsdp_runs):
    d = runs['dir']
    assert fsdp_runs['killed_rc'] != 0 and fsdp_runs['killed_ckpts'] == ['step_00000003'], fsdp_runs
    res = fsdp_runs['resumed']
    assert res['sharded'] and res['status'] == 'COMPLETED' and res['start_step'] == 3, res
    assert_close(losses(d/'fsdp_killed'), losses(d/'fsdp_two'), tol=1e-6)              # same world size: exact
    res = fsdp_runs['w1']                                                              # sharded checkpoint, 1 process
    assert not res['sharded'] and res['start_step'] == 3 and res['world_size'] == 1, res
    assert_close(losses(d/'fsdp_w1'), losses(d/'fsdp_two'))
    res = fsdp_runs['from_ddp']                                                        # DDP checkpoint, sharded run
    assert res['sharded'] and res['start_step'] == 3 and res['status'] == 'COMPLETED', res
    assert_close(losses(d/'ddp_to_fsdp'), losses(d/'two'))

def test_fsdp_compiled_ternary_matches_one_process(runs):
    """(f) The compiled ternary model at 2 micro-batches a step: one process reads its weight codes from the per-step
    cache, FSDP2 ranks (sharded DTensor weights) quantize in the graph, after the all-gather; both train the same."""
    d = runs['dir']
    one = run([sys.executable, str(SCRIPT)], d/'ternary_one', 4, '--ternary', '--max-steps', 4)[1]
    two = run(torchrun_cmd(2), d/'ternary_fsdp', 2, '--ternary', '--strategy', 'fsdp', '--max-steps', 4)[1]
    assert one['codes_per_step'] == [True] and not one['sharded'], one
    assert two['codes_per_step'] == [False] and two['sharded'] and two['status'] == 'COMPLETED', two
    assert_close(losses(d/'ternary_fsdp'), losses(d/'ternary_one'))
