// The analyst's request form (requests.html): "Preview the accuracy" asks the console what the
// request would get at the epsilon their policy allows (POST /requests/preview, computed on the
// server from the request's plan alone: no number here comes from the data), and shows it.
"use strict";

(() => {
  const button = document.getElementById("preview-accuracy");
  if (!button) return;
  const box = document.getElementById("preview");

  function line(tag, text, cls) {
    const node = document.createElement(tag);
    node.textContent = text;
    if (cls) node.className = cls;
    return node;
  }

  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const response = await fetch("/requests/preview", {
        method: "POST", credentials: "same-origin",
        headers: {"Content-Type": "application/json", "Accept": "application/json",
                  "X-CSRF-Token": document.querySelector('meta[name="csrf-token"]').content},
        body: JSON.stringify({request: document.querySelector('textarea[name="request"]').value}),
      });
      const out = await response.json().catch(() => ({error: `the console answered ${response.status}`}));
      const level = out.confidence ? `${Math.round(out.confidence * 100)}%` : "";
      const children = [];
      if (!response.ok) {
        children.push(line("p", out.error, "problem"));
      } else {
        children.push(line("h2", `Expected accuracy at epsilon ${out.epsilon_written} (nothing spent, no data read)`));
        if (out.note) children.push(line("p", out.note, "hint"));
        const table = document.createElement("table");
        table.className = "list";
        table.id = "preview-intervals";
        table.append(line("thead", ""));
        table.tHead.append(Object.assign(document.createElement("tr")));
        for (const h of ["Statistic", `Interval (${level})`, "Note"]) table.tHead.rows[0].append(line("th", h));
        const body = document.createElement("tbody");
        for (const r of out.intervals) {
          const tr = document.createElement("tr");
          tr.dataset.statistic = r.name;
          tr.append(line("td", r.name), line("td", r.written + (r.reference_count ? ` for ${r.reference_count} people` : ""),
                                            "written"), line("td", r.note));
          body.append(tr);
        }
        table.append(body);
        children.push(table);
        if (out.selection && out.selection.half_from) {
          children.push(line("p", `Groups of ${out.selection.half_from} people or more appear at least half the time.`, "hint"));
        }
      }
      box.replaceChildren(...children);
      box.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
})();
