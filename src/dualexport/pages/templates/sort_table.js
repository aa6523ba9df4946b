{#- Re-sorts the entries table by a clicked (or Enter-pressed) header, numerically where both
    cells' data-sort parse as numbers, empty cells last. It loads nothing. -#}
for (const th of document.querySelectorAll("#entries th[data-col]")) {
  th.tabIndex = 0; th.style.cursor = "pointer";
  const go = () => {
    const i = +th.dataset.col, body = document.querySelector("#entries tbody");
    const up = th.dataset.dir !== "asc"; th.dataset.dir = up ? "asc" : "desc";
    const key = (r) => r.cells[i].dataset.sort;
    [...body.rows].sort((p, q) => {
      const a = key(p), b = key(q);
      if (a === b) return 0; if (a === "") return 1; if (b === "") return -1;
      const x = parseFloat(a), y = parseFloat(b);
      const c = isNaN(x) || isNaN(y) ? a.localeCompare(b) : x - y;
      return up ? c : -c;
    }).forEach((r) => body.appendChild(r));
  };
  th.onclick = go; th.onkeydown = (ev) => { if (ev.key === "Enter") go(); };
}
