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
