"""The profile report as one self-contained HTML page, rendered from the JSON report alone
(schema "fastdata.profile.report/3", or /2 or /1), so a saved report.json renders again the same. Over 400
lines: the page's stylesheet and its four charts, each drawn in SVG on the scale helpers they share.

`render(report)` returns the page: inline CSS and inline SVG, no script, font, image or link
to fetch. Every string from the report is escaped; every field may be null or empty."""

from __future__ import annotations

import math
from datetime import datetime
from html import escape
from typing import Any

VERDICT_COLOURS = {"input-bound": "#d64545", "balanced": "#d99a00", "compute-bound": "#2f9e5b", None: "#6b7280"}
WAIT, COMPUTE, STAGE, BOUND, CHOSEN, EPOCH = "#e15759", "#4e79a7", "#9db4cf", "#e15759", "#2f9e5b", "#d9dde4"
# Why a report has no stage table: what a loader needs to time its stages.
UNTIMED = ("not timed (only a fastdata loader times its stages, with its own collation, in workers it starts: a torch "
           "DataLoader, a collate_fn of the script's own, or persistent workers already running leave them untimed)")
OTHER = "#d1d5db"  # a stage timed together (the step's wait), not a cost of the loader's own
CONFIDENCE = {"measured": ("measured", "timed in this run or its tune"),
              "model": ("model", "predicted from the measured stage costs"),
              "rule": ("rule of thumb", "a rule of thumb, not measured")}
W = 1060  # every chart's viewBox width: about the card's width at 1280 px, so text stays near 12 px

CSS = """
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1f2937;
font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
font-variant-numeric:tabular-nums}main{max-width:1120px;margin:0 auto;padding:28px 24px 48px}
header{display:flex;justify-content:space-between;align-items:baseline;gap:24px;margin-bottom:18px}
header .tool{font-size:13px;font-weight:600;letter-spacing:.06em;text-transform:uppercase;color:#6b7280}
header h1{margin:2px 0 0;font-size:20px;font-weight:600;word-break:break-all}
header .when{color:#6b7280;font-size:13px;white-space:nowrap}
.card{background:#fff;border:1px solid #e3e6eb;border-radius:12px;padding:20px 24px;margin-bottom:18px;
box-shadow:0 1px 2px rgba(16,24,40,.04)}.card h2{margin:0 0 4px;font-size:16px;font-weight:650}
.card .sub{margin:0 0 12px;color:#6b7280;font-size:13px}
.headline{display:flex;gap:28px;align-items:stretch;flex-wrap:wrap}
.badge{display:inline-block;color:#fff;font-weight:700;font-size:22px;padding:6px 16px;border-radius:8px;
letter-spacing:.02em}.verdict{flex:1 1 420px}.verdict p{font-size:19px;margin:12px 0 0}
.first{flex:1 1 420px;background:#f8fafc;border:1px solid #e3e6eb;border-left:4px solid var(--accent);
border-radius:8px;padding:12px 16px}
.first .label{font-size:12px;font-weight:600;text-transform:uppercase;letter-spacing:.06em;color:#6b7280}
.first p{margin:4px 0 8px;font-size:16px;font-weight:600}.first .sub{font-size:13px;color:#6b7280}
.chip{display:inline-block;font-size:12px;padding:1px 8px;border-radius:999px;background:#eef1f5;color:#374151;
margin-right:6px;white-space:nowrap}.chip.measured{background:#e3f4ea;color:#1e6b40}
.chip.model{background:#e6eef8;color:#2b5689}.chip.gain{background:#fff4d6;color:#7a5300}
.flags{border-color:#f1b3b3;background:#fff5f5}.flags h2{color:#b42323}
.flags li{margin:4px 0;font-weight:600;color:#7f1d1d}
.tiles{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:14px}
.tile{border:1px solid #e3e6eb;border-radius:10px;padding:12px 14px}
.tile .k{font-size:12px;color:#6b7280;text-transform:uppercase;letter-spacing:.05em}
.tile .v{font-size:26px;font-weight:650;margin:2px 0 6px;line-height:1.2}
.tile .v small{display:block;font-size:12px;font-weight:400;color:#6b7280}
.tile .bar{height:6px;border-radius:3px;background:#eef1f5;overflow:hidden}.tile .bar i{display:block;height:100%}
.tile .note{font-size:12px;color:#6b7280;margin-top:6px}svg{display:block;width:100%;height:auto}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;font-size:12px;fill:#374151}
svg .axis{stroke:#9ca3af}svg .grid{stroke:#eceef2}svg .muted{fill:#6b7280;font-size:11px}
.legend{display:flex;gap:18px;font-size:13px;color:#4b5563;margin-top:6px;flex-wrap:wrap}
.legend .diamond::before{background:#fff;border:1.5px solid #374151;transform:rotate(45deg);width:8px;height:8px}
.warn{border-color:#f0d58c;background:#fffbeb}.warn h2{color:#8a5a00}
.legend span::before{content:"";display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:6px;
vertical-align:-1px;background:var(--c)}ul.advice{list-style:none;padding:0;margin:0}
ul.advice li{padding:10px 0;border-top:1px solid #eef0f3}ul.advice li:first-child{border-top:0}
ul.advice .t{display:block;margin-bottom:4px}
.reason{background:#f1faf4;border-left:4px solid #2f9e5b;padding:8px 12px;border-radius:6px;margin:12px 0 0}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:18px}.cols .card{margin-bottom:0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:0;font-size:14px}dt{color:#6b7280}
dd{margin:0;word-break:break-word}table{border-collapse:collapse;width:100%;font-size:14px}
th,td{text-align:left;padding:5px 8px;border-top:1px solid #eef0f3}th{color:#6b7280;font-weight:600;border-top:0}
code{font-family:ui-monospace,"SF Mono",Menlo,Consolas,monospace;font-size:13px}
.empty{color:#6b7280;font-style:italic}
"""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _n(v: Any) -> str:
    """A figure as the page writes it: thousands separated, no decimals (a rate, a count)."""
    if not _number(v):
        return "—"
    return f"{v:,.0f}"


def _ms(v: float) -> str:
    """Milliseconds to about three significant digits."""
    if 0 < v < 0.001:
        return "< 0.001"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 or v == 0 else f"{v:.2g}"


def _val(v: Any) -> str:
    """A config or environment value, escaped: null as a dash, booleans as yes/no."""
    return "—" if v is None else ("yes" if v else "no") if isinstance(v, bool) else escape(str(v))


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten apart) covering [lo, hi]."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    first = math.floor(lo / step + 1e-9)
    return [k * step for k in range(first, math.ceil(hi / step - 1e-9) + 1)]


def _tick_label(t: float, ticks: list[float]) -> str:
    digits = next((d for d in range(4) if all(abs(round(x, d) - x) < 1e-9 for x in ticks)), 4)
    return f"{t:,.{digits}f}"


def _svg(height: float, body: str, label: str) -> str:
    return f'<svg viewBox="0 0 {W} {height:.0f}" role="img" aria-label="{escape(label)}">{body}</svg>'


def _card(title: str, body: str, sub: str = "", cls: str = "") -> str:
    sub = f'<p class="sub">{sub}</p>' if sub else ""
    return f'<section class="card {cls}"><h2>{title}</h2>{sub}{body}</section>'


def _chips(advice: dict[str, Any], current: float | None) -> str:
    out = []
    predicted = advice.get("predicted_images_per_s")
    if isinstance(predicted, (int, float)):
        gain = f" ({100 * (predicted / current - 1):+.0f}%)" if current else ""
        out.append(f'<span class="chip gain">about {_n(predicted)} images/s{gain}</span>')
    name, meaning = CONFIDENCE.get(advice.get("confidence"), (advice.get("confidence"), ""))
    if name:
        out.append(f'<span class="chip {escape(str(advice.get("confidence")))}" title="{escape(meaning)}">'
                   f'{escape(str(name))}</span>')
    if advice.get("change"):
        out.append("<code>" + escape(", ".join(f"{k}={v!r}" for k, v in advice["change"].items())) + "</code>")
    return "".join(out)


def _current_rate(report: dict[str, Any]) -> float | None:
    rates = report.get("rates") or {}
    return rates.get("together_images_per_s") or rates.get("loader_alone_images_per_s")


def _header(report: dict[str, Any]) -> str:
    created = report.get("created") or ""
    try:
        when = datetime.fromisoformat(created.replace("Z", "+00:00")).strftime("%Y-%m-%d %H:%M %Z").strip()
    except (ValueError, AttributeError):
        when = str(created)
    source = escape(str(report.get("source") or "a loader"))
    return (f'<header><div><div class="tool">fastdata-profile</div><h1>{source}</h1></div>'
            f'<div class="when">{escape(when)}</div></header>')


def _headline(report: dict[str, Any]) -> str:
    verdict = report.get("verdict")
    colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS[None])
    explanation = report.get("explanation") or ("the loader was timed alone: give a step to see what bounds training"
                                                if verdict is None else "")
    first = report.get("first_change")
    if first:
        change = f'<p>{escape(str(first.get("text") or ""))}</p>{_chips(first, _current_rate(report))}'
    elif report.get("headline"):  # schema /3: what bounds the step and what would help
        change = f'<p>{escape(str(report["headline"]))}</p>'
    else:
        change = "<p>nothing to change</p>"
        if verdict == "input-bound" and report.get("advice"):
            change += '<div class="sub">no keyword change is predicted to help here: the advice below says why</div>'
    return (f'<section class="card"><div class="headline" style="--accent:{colour}"><div class="verdict">'
            f'<span class="badge" style="background:{colour}">{escape(verdict or "loader only")}</span>'
            f'<p>{escape(explanation)}</p></div><div class="first"><div class="label">the one change to make first'
            f'</div>{change}</div></div></section>')


def _flags(report: dict[str, Any]) -> str:
    flags = report.get("flags") or []
    if not flags:
        return ""
    items = "".join(f"<li>{escape(str(f))}</li>" for f in flags)
    return _card("Figures that are not valid measurements", f"<ul>{items}</ul>",
                 "each was flagged, not trusted: do not act on it", "flags")


def _rates(report: dict[str, Any]) -> str:
    rates = report.get("rates") or {}
    tiles = [("loader alone", rates.get("loader_alone_images_per_s"), "the loader, nothing else", COMPUTE),
             ("step alone", rates.get("step_alone_images_per_s"), "the step on a batch kept in memory"
              + (f"; its own CPU {cpu:.2f} ms an image" if (cpu := rates.get("step_alone_cpu_ms_per_image")) else ""),
              "#59a14f"),
             ("together", rates.get("together_images_per_s"), "the loader feeding the step", "#7c6fb0"),
             ("ceiling", rates.get("ceiling_images_per_s"), "what the machine's cores decode at most", "#9ca3af")]
    tiles = [t for t in tiles if t[1] is not None or t[0] != "ceiling"]
    top = max((v for _, v, _, _ in tiles if isinstance(v, (int, float))), default=0) or 1
    out = []
    for name, v, note, colour in tiles:
        width = 100 * v / top if isinstance(v, (int, float)) else 0
        out.append(f'<div class="tile"><div class="k">{name}</div><div class="v">{_n(v)} <small>images/s</small></div>'
                   f'<div class="bar"><i style="width:{width:.1f}%;background:{colour}"></i></div>'
                   f'<div class="note">{note}</div></div>')
    stall = report.get("stall_fraction")
    if isinstance(stall, (int, float)):
        out.append(f'<div class="tile"><div class="k">stall</div><div class="v">{100 * stall:.0f}% '
                   f'<small>waiting</small></div>'
                   f'<div class="bar"><i style="width:{100 * stall:.1f}%;background:{WAIT}"></i></div>'
                   f'<div class="note">of the time, the step waited for data</div></div>')
    size = report.get("batch_size")
    sub = f"batches of {_n(size)} images" if size else "images per second"
    return _card("Throughput", f'<div class="tiles">{"".join(out)}</div>', sub)


def _timeline(report: dict[str, Any]) -> str:
    steps = report.get("steps") or []
    if not steps:
        return _card("Step timeline", '<p class="empty">no step was given: the loader was timed alone</p>')
    waits = [float(s.get("wait_ms") or 0) for s in steps]
    comps = [float(s.get("compute_ms") or 0) for s in steps]
    totals = sorted(w + c for w, c in zip(waits, comps))
    # an epoch start can wait many times a steady step; cut such bars so the others stay readable
    typical = totals[int(0.9 * (len(totals) - 1))]
    cap = totals[-1] if totals[-1] <= 3 * typical or typical <= 0 else 1.5 * typical
    yt = _ticks(0, cap or 1.0)
    left, top, pw, ph = 64, 22, W - 80, 240
    y = lambda v: top + ph - ph * min(v, yt[-1]) / yt[-1]  # noqa: E731
    slot = pw / len(steps)
    bw = max(slot * 0.78, 0.6)
    body = [f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
            f'<text x="{left - 8}" y="{y(t) + 4:.1f}" text-anchor="end">{_tick_label(t, yt)}</text>' for t in yt]
    body += [f'<rect x="{left + k * slot:.2f}" y="{top}" width="{slot:.2f}" height="{ph}" fill="{EPOCH}"/>'
             for k, s in enumerate(steps) if s.get("epoch_start")]
    cut = False
    for k, (w, c) in enumerate(zip(waits, comps)):
        x = left + k * slot + (slot - bw) / 2
        tip = f"step {k + 1}: waited {_ms(w)} ms, computed {_ms(c)} ms"
        body.append(f'<g><title>{tip}</title><rect x="{x:.2f}" y="{y(w):.2f}" width="{bw:.2f}" '
                    f'height="{y(0) - y(w):.2f}" fill="{WAIT}"/><rect x="{x:.2f}" y="{y(w + c):.2f}" '
                    f'width="{bw:.2f}" height="{y(w) - y(w + c):.2f}" fill="{COMPUTE}"/></g>')
        if w + c > yt[-1]:
            cut = True  # two white strokes across the bar's top say it goes on
            body.append(f'<path d="M{x:.2f},{top + 9}l{bw:.2f},-4m{-bw:.2f},9l{bw:.2f},-4" stroke="#fff" '
                        f'stroke-width="2"/><text class="muted" x="{x + bw / 2:.1f}" y="{top - 6}" '
                        f'text-anchor="middle">{_ms(w + c)}</text>')
    xt = sorted({1, *(t for t in _ticks(0, len(steps), 10) if t >= 1 and t == int(t))})
    body += [f'<line class="axis" x1="{left + (t - .5) * slot:.1f}" x2="{left + (t - .5) * slot:.1f}" '
             f'y1="{top + ph}" y2="{top + ph + 5}"/><text x="{left + (t - .5) * slot:.1f}" y="{top + ph + 19}" '
             f'text-anchor="middle">{t:.0f}</text>' for t in xt]
    body.append(f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{top + ph}" y2="{top + ph}"/>'
                f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + ph}"/>'
                f'<text x="{left + pw / 2}" y="{top + ph + 38}" text-anchor="middle">step number</text>'
                f'<text transform="translate(16 {top + ph / 2}) rotate(-90)" text-anchor="middle">ms per step</text>')
    legend = (f'<span style="--c:{WAIT}">waiting for data</span><span style="--c:{COMPUTE}">compute (the step)</span>'
              f'<span style="--c:{EPOCH}">a step that began an epoch</span>')
    med = [_ms(sorted(v)[len(v) // 2]) for v in (waits, comps)]
    sub = (f"{len(steps)} steps run together; median wait {med[0]} ms, median compute {med[1]} ms"
           + ("; bars taller than the axis are cut, their total written above them" if cut else ""))
    chart = _svg(top + ph + 46, "".join(body), "the time of each step, waiting and computing")
    return _card("Step timeline", f'{chart}<div class="legend">{legend}</div>', sub)


def _bars(rows: list[tuple[str, str, float, str, str, bool]], left: int, right: int, top: int, axis: str,
          label: str, line: tuple[float, str] | None = None) -> str:
    """Horizontal bars from 0 on one scale. A row is (name, note, value, the value as written,
    fill, bold); `line` is (value, its text): a dashed vertical line across the bars."""
    row, pw = 44, W - left - right
    xt = _ticks(0, max([v for _, _, v, _, _, _ in rows] + [line[0] if line else 0]) or 1.0)
    x = lambda v: left + pw * v / xt[-1]  # noqa: E731
    bottom = top + row * len(rows)
    body = [f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}"/>'
            f'<text x="{x(t):.1f}" y="{bottom + 18}" text-anchor="middle">{_tick_label(t, xt)}</text>' for t in xt]
    values = []  # written last, with a white halo, so the line does not cross out a figure
    for k, (name, note, v, text, fill, bold) in enumerate(rows):
        y0 = top + row * k
        body.append(f'<text x="0" y="{y0 + 18}" style="font-size:14px;font-weight:{700 if bold else 500}">{name}'
                    f'</text><text class="muted" x="0" y="{y0 + 35}">{note}</text><rect x="{left}" y="{y0 + 10}" '
                    f'width="{max(x(v) - left, 1):.1f}" height="22" rx="3" fill="{fill}"/>')
        values.append(f'<text x="{x(v) + 8:.1f}" y="{y0 + 26}" stroke="#fff" stroke-width="4" paint-order="stroke" '
                      f'style="font-weight:{700 if bold else 400}">{text}</text>')
    body.append(f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{bottom}" y2="{bottom}"/>'
                f'<text x="{left + pw / 2}" y="{bottom + 38}" text-anchor="middle">{axis}</text>')
    if line:
        body.append(f'<line x1="{x(line[0]):.1f}" x2="{x(line[0]):.1f}" y1="{top - 6}" y2="{bottom}" stroke="{COMPUTE}"'
                    f' stroke-width="2.5" stroke-dasharray="6 3"/><text x="{x(line[0]):.1f}" y="{top - 10}" '
                    f'text-anchor="middle" style="fill:{COMPUTE};font-weight:600">{line[1]}</text>')
    return _svg(bottom + 46, "".join(body + values), label)


def _sizes(report: dict[str, Any]) -> str:
    sizes = [s for s in report.get("sizes") or [] if isinstance(s, dict)]
    if not sizes:
        return ""
    step = (report.get("rates") or {}).get("step_alone_images_per_s")
    step = step if _number(step) else None
    rows = []
    for s in sizes:
        v = s.get("images_per_s") if _number(s.get("images_per_s")) else None
        bound = step is not None and v is not None and v < step
        size = s.get("size") if isinstance(s.get("size"), list) else None
        wh = "×".join(str(d) for d in reversed(size)) if size else "?"  # [h, w] written as w×h
        batches = s.get("batches")
        rows.append((f"from epoch {_n(s.get('epoch'))}, {escape(wh)}", f'over {_n(batches)} batch'
                     f'{"" if batches == 1 else "es"}', v or 0.0, f'{_n(v)} images/s{" · input-bound" * bound}',
                     BOUND if bound else STAGE, bound))
    sub = "the loader alone over the first batches of the first epoch at each size, width × height"
    chart = _bars(rows, 240, 250, 26, "images/s, the loader alone", "the loader's rate at each size of the schedule",
                  None if step is None else (step, f"step {_n(step)} images/s"))
    if step is None:
        return _card("Rate at each size of the schedule", chart, sub)
    legend = (f'<div class="legend"><span style="--c:{BOUND}">below the step\'s rate: input-bound at this size</span>'
              f'<span style="--c:{STAGE}">the loader keeps up</span><span style="--c:{COMPUTE}">the step alone '
              f'(dashed line)</span></div>')
    return _card("Rate at each size of the schedule", chart + legend,
                 sub + "; a size whose bar stops short of the step's line is input-bound")


def _stages(report: dict[str, Any]) -> str:
    stages = report.get("stages") or []
    if not stages:
        return _card("Where an image's time goes", f"<p>{escape(UNTIMED)}</p>")
    rows = []
    for s in stages:
        bound, v = bool(s.get("bound")), float(s.get("ms_per_image") or 0)
        where = f' · {s["where"]}' if s.get("where") else ""
        text = ("—" if s.get("ms_per_image") is None else _ms(v)) + (" ms · the bound" if bound else "")
        rows.append((escape(str(s.get("name") or "?")), escape(str(s.get("what") or "") + where), v, text,
                     BOUND if bound else OTHER if s.get("where") == "together" else STAGE, bound))
    return _card("Where an image's time goes",
                 _bars(rows, 360, 150, 8, "ms per image", "milliseconds per image of each stage"),
                 "ms per image, loader alone; worker stages summed over the workers; the bound stage costs the most")


def _same(config: dict[str, Any], chosen: dict[str, Any]) -> bool:
    """Whether a candidate's config is the chosen one: equal on every keyword the two share."""
    shared = config.keys() & chosen.keys()
    return bool(shared) and all(config[k] == chosen[k] for k in shared)


def _tune(report: dict[str, Any]) -> str:
    tune = report.get("tune")
    if not tune:
        return ""
    rows = [("probe", c) for c in tune.get("probes") or []] + [("finalist", c) for c in tune.get("candidates") or []]
    configs = [r[1].get("config") or {} for r in rows]
    keys = [k for k in dict.fromkeys(k for c in configs for k in c) if len({repr(c.get(k)) for c in configs}) > 1]
    keys = keys or list(dict.fromkeys(k for c in configs for k in c))
    chosen = tune.get("chosen")
    nums = [v for _, c in rows for v in [c.get("predicted_images_per_s"), c.get("median_images_per_s"),
                                         *(c.get("interval_images_per_s") or []), *(c.get("runs_images_per_s") or [])]
            if isinstance(v, (int, float))]
    # the chosen row: the finalist with the chosen config (a probe may share it), else the probe
    pick = next((k for k, (_, c) in reversed(list(enumerate(rows))) if _same(c.get("config") or {}, chosen or {})),
                None)
    body, left, right, row, top = [], 300, 300, 34, 8
    pw = W - left - right
    if rows and nums:
        lo, hi = min(nums), max(nums)
        pad = 0.05 * (hi - lo or hi or 1)
        xt = _ticks(max(0, lo - pad), hi + pad)
        x = lambda v: left + pw * (v - xt[0]) / (xt[-1] - xt[0])  # noqa: E731
        bottom = top + row * len(rows)
        body += [f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}"/>'
                 f'<text x="{x(t):.1f}" y="{bottom + 18}" text-anchor="middle">{_tick_label(t, xt)}</text>' for t in xt]
        for k, (kind, c) in enumerate(rows):
            yc = top + row * k + row / 2
            picked = k == pick
            colour = CHOSEN if picked else COMPUTE if kind == "finalist" else "#9ca3af"
            if picked:
                body.append(f'<rect x="0" y="{yc - row / 2 + 2:.1f}" width="{W}" height="{row - 4}" rx="5" '
                            f'fill="#eaf6ee"/>')
            label = ", ".join(f"{k_}={(c.get('config') or {}).get(k_)}" for k_ in keys)
            body.append(f'<text x="8" y="{yc + 4:.1f}" style="font-weight:{700 if picked else 400}">'
                        f'{escape(label)}</text><text class="muted" x="{left - 10}" y="{yc + 4:.1f}" '
                        f'text-anchor="end">{"chosen" if picked else kind}</text>')
            for r in c.get("runs_images_per_s") or []:
                body.append(f'<line x1="{x(r):.1f}" x2="{x(r):.1f}" y1="{yc - 8:.1f}" y2="{yc + 8:.1f}" '
                            f'stroke="{colour}" stroke-opacity=".35" stroke-width="2"/>')
            iv = c.get("interval_images_per_s") or []
            if len(iv) == 2 and all(isinstance(v, (int, float)) for v in iv):
                a, b = x(iv[0]), x(iv[1])
                body.append(f'<path d="M{a:.1f},{yc:.1f}H{b:.1f}M{a:.1f},{yc - 6:.1f}v12M{b:.1f},{yc - 6:.1f}v12" '
                            f'stroke="{colour}" stroke-width="2" fill="none"/>')
            p = c.get("predicted_images_per_s")
            if isinstance(p, (int, float)):
                body.append(f'<path d="M{x(p):.1f},{yc - 6:.1f}l6,6l-6,6l-6,-6z" fill="#fff" stroke="#374151" '
                            f'stroke-width="1.5"/>')
            m = c.get("median_images_per_s")
            if isinstance(m, (int, float)):
                body.append(f'<circle cx="{x(m):.1f}" cy="{yc:.1f}" r="5.5" fill="{colour}"/>')
            span = f" ({_n(iv[0])}–{_n(iv[1])})" if len(iv) == 2 else ""
            pred = f'<tspan class="muted"> · predicted {_n(p)}</tspan>' if isinstance(p, (int, float)) else ""
            body.append(f'<text x="{left + pw + 14}" y="{yc + 4:.1f}">{_n(m)}{span}{pred}</text>')
        body.append(f'<line class="axis" x1="{left}" x2="{left + pw}" y1="{bottom}" y2="{bottom}"/>'
                    f'<text x="{left + pw / 2}" y="{bottom + 38}" text-anchor="middle">images/s</text>')
        chart = _svg(bottom + 46, "".join(body), "each tuned configuration's measured rate and its interval")
    else:
        chart = '<p class="empty">no configuration was measured</p>'
    legend = (f'<span style="--c:{COMPUTE}">median of the measured runs, with its interval (error bar) and each '
              f'run (light ticks)</span><span class="diamond">predicted by the model</span>'
              f'<span style="--c:{CHOSEN}">the chosen configuration</span>')
    chosen_text = ", ".join(f"{k}={v}" for k, v in (chosen or {}).items()) or "none"
    seconds = tune.get("seconds")
    sub = f"tuned in {seconds:,.0f} s; " if isinstance(seconds, (int, float)) else ""
    reason = (f'<p class="reason"><b>chose</b> <code>{escape(chosen_text)}</code>: '
              f'{escape(str(tune.get("reason") or ""))}</p>')
    return _card("The tune", f'{chart}<div class="legend">{legend}</div>{reason}',
                 f"{sub}each configuration's measured runs, their median and interval, beside the model's prediction")


def _advice(report: dict[str, Any]) -> str:
    advice = report.get("advice") or []
    current = _current_rate(report)
    items = "".join(f'<li><span class="t">{escape(str(a.get("text") or ""))}</span>{_chips(a, current)}</li>'
                    for a in advice) or '<li class="empty">no advice: nothing to change on the input side</li>'
    predicted = any(isinstance(a.get("predicted_images_per_s"), (int, float)) for a in advice)
    gains = f" (gains against {_n(current)} images/s now)" if current and predicted else ""
    return _card("Advice", f'<ul class="advice">{items}</ul>', f"most useful first{gains}")


def _skipped(report: dict[str, Any]) -> str:
    skipped = report.get("skipped") or {}
    count = skipped.get("count")
    if not _number(count) or not count:
        return ""
    examples = [e for e in skipped.get("examples") or [] if isinstance(e, dict)]
    files = skipped.get("files") if _number(skipped.get("files")) else count  # schema /1: no "files"
    rows = "".join(f'<tr><td><code>{escape(str(e.get("path") or ""))}</code></td>'
                   f'<td>{escape(str(e.get("cause") or ""))}</td><td>{_n(e.get("count"))}</td></tr>'
                   for e in examples[:10])
    more = f'<p class="empty">and {_n(files - 10)} more in report.json</p>' if files > 10 and rows else ""
    table = f"<table><tr><th>file</th><th>cause</th><th>times</th></tr>{rows}</table>{more}" if rows else ""
    times = f" ({_n(count)} times)" if count != files else ""
    return _card(f'{_n(files)} file{"s" if files != 1 else ""} skipped{times}', table,
                 "unreadable samples left out of the profile (<code>--on-error skip</code>), each file once", "warn")


def _pairs(title: str, items: dict[str, Any]) -> str:
    rows = "".join(f"<dt>{escape(str(k))}</dt><dd>{_val(v)}</dd>" for k, v in items.items())
    return _card(title, f"<dl>{rows}</dl>" if rows else '<p class="empty">not recorded</p>')


def render(report: dict[str, Any]) -> str:
    """The report (a dict of schema "fastdata.profile.report/3", or /2 or /1) as one self-contained page."""
    env = dict(report.get("environment") or {})
    if env.get("pillow") and env.get("pillow_simd") is not None:
        env["pillow"] = f'{env["pillow"]}{" (SIMD)" if env.pop("pillow_simd") else ""}'
    env["created"] = report.get("created")
    config = dict(report.get("config") or {})
    if report.get("batch_size") is not None:
        config.setdefault("batch_size", report["batch_size"])
    title = f"fastdata-profile: {report.get('verdict') or 'loader only'} · {report.get('source') or ''}"
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
            f"{_header(report)}{_flags(report)}{_headline(report)}{_rates(report)}{_timeline(report)}"
            f"{_sizes(report)}{_stages(report)}{_tune(report)}{_advice(report)}{_skipped(report)}"
            f"<div class='cols'>{_pairs('Environment', env)}{_pairs('Config', config)}</div>"
            "</main></body></html>\n")
