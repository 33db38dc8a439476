// Search over the prebuilt index (assets/search_index.js): works from file:// and any static host, no server.
(function () {
  const box = document.getElementById('search'), out = document.getElementById('results');
  const idx = window.SEARCH_INDEX || [];
  const esc = s => s.replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
  function snippet(text, term) {
    const i = text.toLowerCase().indexOf(term);
    if (i < 0) return '';
    const s = Math.max(0, i - 60), e = Math.min(text.length, i + term.length + 80);
    return (s ? '… ' : '') + esc(text.slice(s, i)) + '<mark>' + esc(text.slice(i, i + term.length)) + '</mark>' + esc(text.slice(i + term.length, e)) + ' …';
  }
  function search(q) {
    const terms = q.toLowerCase().split(/\s+/).filter(Boolean);
    if (!terms.length) return [];
    const hits = [];
    for (const p of idx) {
      const hay = (p.t + ' ' + p.s + ' ' + p.x).toLowerCase();
      if (!terms.every(t => hay.includes(t))) continue;
      let score = 0, url = p.u;
      for (const t of terms) {
        if (p.t.toLowerCase().includes(t)) score += 10;
        const h = p.h.find(([id, title]) => title.toLowerCase().includes(t));
        if (h) { score += 5; url = p.u + '#' + h[0]; }
        score += Math.min(5, hay.split(t).length - 1) / 5;
      }
      hits.push({p, score, url});
    }
    return hits.sort((a, b) => b.score - a.score).slice(0, 12);
  }
  function show() {
    const q = box.value.trim();
    if (!q) { out.hidden = true; return; }
    const hits = search(q);
    out.innerHTML = hits.length ? hits.map(h => '<a href="' + h.url + '"><b>' + esc(h.p.t) + '</b><span>' +
      (snippet(h.p.x, q.toLowerCase().split(/\s+/)[0]) || esc(h.p.s)) + '</span></a>').join('')
      : '<div class="none">No results for “' + esc(q) + '”</div>';
    out.hidden = false;
  }
  if (box) {
    box.addEventListener('input', show);
    box.addEventListener('keydown', e => {
      if (e.key === 'Enter') { const a = out.querySelector('a'); if (a) location.href = a.href; }
      if (e.key === 'Escape') { box.value = ''; out.hidden = true; }
    });
    document.addEventListener('keydown', e => { if (e.key === '/' && document.activeElement !== box) { e.preventDefault(); box.focus(); } });
    document.addEventListener('click', e => { if (!e.target.closest('.search')) out.hidden = true; });
  }
})();

// A copy button on every code block (input cells, show_doc signatures, markdown code); works from file:// too.
(function () {
  function copy(text, btn) {
    const done = () => { btn.textContent = 'Copied'; btn.classList.add('done'); setTimeout(() => { btn.textContent = 'Copy'; btn.classList.remove('done'); }, 1500); };
    if (navigator.clipboard && window.isSecureContext) { navigator.clipboard.writeText(text).then(done, () => fallback(text, done)); }
    else fallback(text, done);
  }
  function fallback(text, done) {
    const t = document.createElement('textarea'); t.value = text; t.style.position = 'fixed'; t.style.opacity = '0';
    document.body.appendChild(t); t.select(); try { document.execCommand('copy'); done(); } catch (e) {} t.remove();
  }
  document.querySelectorAll('.content .highlight').forEach(block => {
    const pre = block.querySelector('pre');
    if (!pre || (block.closest('.output_wrapper') && !block.closest('.output_markdown'))) return;   // not on outputs
    block.classList.add('has-copy');
    const btn = document.createElement('button'); btn.className = 'copy'; btn.type = 'button'; btn.textContent = 'Copy';
    btn.setAttribute('aria-label', 'copy code'); btn.addEventListener('click', () => copy(pre.innerText, btn));
    block.appendChild(btn);
  });
})();
