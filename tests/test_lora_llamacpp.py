"""The GGUF LoRA adapter of wf_nb.lora.export_lora_gguf in the real llama.cpp (npm node-llama-cpp, as tests/test_llamacpp.py):
on a random tiny BitNet exported to GGUF, llama.cpp's change of the log-probs when the adapter is loaded is wf_nb's
base + adapter change (slope and correlation ~1), on all seven projections; both for an unpadded base (Q2_0, 256 wide)
and for a base as SmolLM2's default export pads it (576 wide, 9 heads / 3 KV heads -> 768, 12 / 4 in TQ2_0), with the
adapter padded from the base file (`base_gguf=`)."""
import copy, json, os, shutil, subprocess
from pathlib import Path
import numpy as np, pytest, torch, torch.nn as nn

NLC = Path(os.environ.get('WF_NODE_LLAMA_CPP', Path.home() / '.cache' / 'wf_nb' / 'node-llama-cpp'))
ADDON = NLC / 'node_modules' / '@node-llama-cpp' / 'linux-x64' / 'bins' / 'linux-x64' / 'llama-addon.node'
pytestmark = [pytest.mark.skipif(shutil.which('node') is None, reason='node is not installed'),
              pytest.mark.skipif(not ADDON.exists(), reason=f'node-llama-cpp is not installed in {NLC} (see tests/test_llamacpp.py)')]

SCRIPT = r'''
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
const { getLlama } = await import(pathToFileURL(join(process.env.WF_NODE_LLAMA_CPP, "node_modules", "node-llama-cpp", "dist", "index.js")).href);
const req = JSON.parse(readFileSync(0, "utf8"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error", progressLogs: false });
const model = await llama.loadModel({ modelPath: req.model, gpuLayers: 0 });
const out = [];
for (const lora of req.loras) {
  const context = await model.createContext({ contextSize: 256, threads: 1, batchSize: 256, sequences: 1,
                                               ...(lora ? { lora: { adapters: [{ filePath: lora, scale: 1 }] } } : {}) });
  const full = { temperature: 1, topK: 0, topP: 1, minP: 0 };
  const res = await context.getSequence().controlledEvaluate(req.tokens.slice(0, -1).map((t) => [t, { generateNext: { probabilities: true, options: full } }]));
  out.push(res.map((r, i) => Math.log(r.next.probabilities.get(req.tokens[i + 1]) ?? 0)));
  await context.dispose();
}
console.log(JSON.stringify(out));
'''


@pytest.mark.parametrize('hidden,heads,kv,ttype', [(256, 4, 2, 'q2_0'), (576, 9, 3, 'auto')], ids=['unpadded', 'padded-576'])
def test_gguf_lora_adapter_in_llamacpp(tmp_path, hidden, heads, kv, ttype):
    pytest.importorskip('wf_nb.gguf_export')   # the base's GGUF writer (tests/test_llamacpp.py's)
    from transformers import BitNetConfig, BitNetForCausalLM
    from wf_nb.quant import BitLinear
    from wf_nb.config import get_config
    from wf_nb.assets import load_tokenizer, shakespeare_files
    from wf_nb.export import pack_model
    from wf_nb.gguf_export import write_gguf, read_gguf
    from wf_nb.lora import add_lora, save_adapter, load_adapter, export_lora_gguf
    tok = load_tokenizer(get_config(model='smollm2_135m').model)
    ids = tok(shakespeare_files()[0].read_text()[30000:32000]).input_ids[:40]
    cfg = BitNetConfig(vocab_size=49152, hidden_size=hidden, intermediate_size=512, num_hidden_layers=2, num_attention_heads=heads,
                       num_key_value_heads=kv, hidden_act='silu', tie_word_embeddings=True, max_position_embeddings=512)
    torch.manual_seed(0)
    base = BitNetForCausalLM(cfg).eval()
    for n, lin in [(n, l) for n, l in base.named_modules() if isinstance(l, nn.Linear) and n != 'lm_head']:
        base.set_submodule(n, BitLinear.from_linear(lin))
    m = add_lora(copy.deepcopy(base), get_config(['peft.method=lora', 'peft.r=8', 'peft.alpha=16']).peft, seed=0)
    for n, p in m.named_parameters():
        if 'lora_B' in n: torch.nn.init.normal_(p, std=0.3)
    save_adapter(m, tmp_path/'adapter')
    write_gguf(pack_model(base), tmp_path/'base.gguf', tok, ttype, 'f16')
    meta, _ = read_gguf(tmp_path/'base.gguf')
    assert (meta['bitnet.embedding_length'] > hidden) == (hidden % 256 != 0)   # the padded case pads
    shapes = export_lora_gguf(tmp_path/'adapter', tmp_path/'adapter.gguf', base_gguf=tmp_path/'base.gguf')   # s from the file
    assert shapes['blk.0.attn_q.weight.lora_a'][1] == meta['bitnet.embedding_length']
    (tmp_path/'run.mjs').write_text(SCRIPT)
    req = dict(model=str(tmp_path/'base.gguf'), tokens=ids, loras=[None, str(tmp_path/'adapter.gguf')])
    r = subprocess.run(['node', str(tmp_path/'run.mjs')], input=json.dumps(req), capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'WF_NODE_LLAMA_CPP': str(NLC)})
    assert r.returncode == 0, r.stderr[-2000:]
    lb, la = map(np.array, json.loads(r.stdout.strip().splitlines()[-1]))

    def wf(model):   # f16 embeddings, as the GGUF stores them
        model = copy.deepcopy(model)
        with torch.no_grad():
            w = model.model.embed_tokens.weight; w.copy_(w.half().float())
            lp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        return np.array([lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)])
    wb, wa = wf(base), wf(load_adapter(copy.deepcopy(base), tmp_path/'adapter'))
    ew, el = wa - wb, la - lb
    assert np.abs(ew).mean() > 0.1                                     # the adapter changes the model
    slope, corr = (ew @ el) / (ew @ ew), np.corrcoef(ew, el)[0, 1]
    assert abs(slope - 1) < 0.03 and corr > 0.99, (slope, corr)
    assert np.abs(la - wa).max() < 0.1, np.abs(la - wa).max()          # base + adapter: the same log-probs to rounding (0.008-0.012 measured)
    print(f'{hidden} wide: slope {slope:.4f}, corr {corr:.5f}, mean |change| {np.abs(ew).mean():.3f}, '
          f'max |llama.cpp - wf_nb| base {np.abs(lb - wb).max():.4f}, base + adapter {np.abs(la - wa).max():.4f}')
