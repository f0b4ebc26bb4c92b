"""report.html as a person reads it, checked on the page's structure (each plot parsed as
SVG): numbers with units and sensible digits, an all-zero series drawn as zero, memory over
the whole run, the estimate rescaled to the iterations run beside the one made before it,
no JavaScript, and every plot with axes, units and a legend."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from arrayjob.report.figures import nice_ticks, quantity
from arrayjob.report.html import render
from arrayjob.units import dollars, duration, significant

SVG = "{http://www.w3.org/2000/svg}"


def demo_report() -> dict[str, Any]:
    """The demo's report as a user saw it: 9 of 100 iterations, one node, nothing moved."""
    stages = [("validate", 0.0, 0.0132), ("connect", 0.0135, 3.4021), ("load", 3.4301, 1.7312),
              ("fit", 5.1618, 0.5127), ("write", 5.6746, 0.0091)]
    estimate_stages = [("connect", 3.0), ("load", 0.772), ("fit", 3.8453), ("write", 0.006), ("shutdown", 1.4)]

    def estimate(iterations: int, fit: float, tasks: int) -> dict[str, Any]:
        return {"wall_seconds": 9.0233 - 3.8453 + fit, "storage": {"bytes_read": 52800064, "get_requests": 22,
                                                                   "bytes_written": 1512, "put_requests": 6},
                "network": {"bytes_between_nodes": 0}, "memory": {"peak_bytes_per_node": [52800064]},
                "tasks": {"count": tasks}, "nodes": {"node_seconds": 9.0233 - 3.8453 + fit},
                "dollars": {"total": 3.9e-05}, "iterations": {"assumed": iterations, "from": "x"},
                "stages": [{"name": n, "wall_seconds": fit if n == "fit" else w} for n, w in estimate_stages]}

    return {
        "job": "logreg-demo", "algorithm": "logreg", "arrayjob_version": "0.1.0", "wall_seconds": 7.0654,
        "stages": [{"name": n, "start_seconds": s, "wall_seconds": w, "tasks": 0} for n, s, w in stages],
        "storage": {"bytes_read": 52800064, "get_requests": 22, "bytes_written": 1953, "put_requests": 6},
        "network": {"bytes_between_nodes": 0}, "tasks": {"count": 78}, "memory": {
            "peak_bytes_per_node": [52800064], "input_block_bytes_per_node": [52800000]},
        "nodes": {"node_seconds": 7.0654}, "dollars": {"total": 3.9e-05},
        "cluster": {"nodes": 1, "node_ids": ["n0"], "cpus": 2},
        "result": {"objective": 0.3574909947077662, "iterations": 9, "converged": True,
                   "gradient_norm": 2.81174715001897e-09, "n_samples": 200000},
        "timeline": [{"seconds": 5.2 + 0.05 * k, "network_bytes": 0, "memory_bytes_per_node": {"n0": 52800064}}
                     for k in range(10)],
        "faults": {"events": []},
        "estimate": estimate(100, 3.8453, 715),
        "estimate_error": {"tasks.count": -0.8909},
        "estimate_rescaled": estimate(9, 0.3512, 78),
        "estimate_rescaled_error": {"tasks.count": 0.0, "wall_seconds": 0.2},
    }


def svgs(page: str) -> dict[str, ET.Element]:
    """Each plot of the page, parsed, by its title."""
    found = {}
    for block in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        root = ET.fromstring(block.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
        found[root.find(f"{SVG}title").text] = root
    return found


def texts(svg: ET.Element, cls: str) -> list[str]:
    return [t.text or "" for t in svg.iter(f"{SVG}text") if t.get("class") == cls]


def visible_text(page: str) -> str:
    """The page's text as shown: no tags, no tooltips (``<title>``), entities decoded."""
    import html

    page = re.sub(r"<title>.*?</title>|<style>.*?</style>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_numbers_have_units_and_sensible_digits():
    page = render(demo_report())
    shown = visible_text(page)
    assert "7.0654" not in shown and "2.81174715001897e-09" not in shown and "0.3574909947077662" not in shown
    decimals = re.findall(r"\d+\.\d+", shown)
    assert decimals and all(len(d.replace(".", "").lstrip("0")) <= 4 for d in decimals), decimals  # 4 significant
    assert re.search(r"\de-\d", shown) is None  # no raw exponent
    assert "7.07 s on 1 node(s)" in shown
    assert "2.81 × 10⁻⁹" in shown and "0.3575" in shown and "200,000" in shown and "yes" in shown
    assert "52.8 MB" in shown and "$0.000039" in shown


def test_every_plot_has_axes_units_and_a_legend_and_no_script():
    page = render(demo_report())
    assert "<script" not in page.lower() and " on" + "load=" not in page
    plots = svgs(page)
    assert set(plots) == {"Wall time per stage", "Object-store memory per node", "Bytes moved between nodes"}
    for title, svg in plots.items():
        assert texts(svg, "ylabel"), title
        assert re.search(r"\((seconds|bytes)\)|cumulative", texts(svg, "ylabel")[0]), title
        assert texts(svg, "xlabel") and texts(svg, "xtick"), title
        assert any(g.get("class") == "legend" for g in svg.iter(f"{SVG}g")), title
        assert all(re.fullmatch(r"[\d.]+ (s|ms|B|kB|MB|GB|TB)|0 s|0 B|", t) for t in texts(svg, "ytick")), \
            (title, texts(svg, "ytick"))


def test_an_all_zero_series_gets_a_zero_axis():
    plot = svgs(render(demo_report()))["Bytes moved between nodes"]
    labels = [t for t in texts(plot, "ytick") if t]
    assert labels == ["0 B"]  # not 1e-12 … 2.5e-13
    assert texts(plot, "all-zero") == ["all zero: every task ran where its inputs were (one node)"]


def test_memory_per_node_spans_the_run_not_a_dash_at_its_end():
    plot = svgs(render(demo_report()))["Object-store memory per node"]
    (line,) = [p for p in plot.iter(f"{SVG}polyline") if p.get("class") == "series"]
    xs = [float(p.split(",")[0]) for p in line.get("points").split()]
    ys = [float(p.split(",")[1]) for p in line.get("points").split()]
    axis = [float(a.get("x1")) for a in plot.iter(f"{SVG}line") if a.get("class") == "grid"][0]
    width = 680 - 16 - axis
    # from the run's start to the end of its last stage (the write), not a dash at the last samples
    assert min(xs) == pytest.approx(axis) and max(xs) == pytest.approx(axis + width * (5.6746 + 0.0091) / 7.0654, abs=0.2)
    assert len(set(ys)) == 2  # none held before the load, then the blocks
    stages = [t.text for g in plot.iter(f"{SVG}g") if g.get("class") == "stage" for t in g.iter(f"{SVG}text")]
    assert {"connect", "load"} <= set(stages)


def test_estimate_rescaled_to_the_iterations_run_beside_the_original():
    page = render(demo_report())
    table = re.search(r'<table class="estimate">(.*?)</table>', page, flags=re.S).group(1)
    heads = re.findall(r"<th>(.*?)</th>", table)
    assert heads == ["figure", "estimate before the run (100 iterations)", "estimate for the 9 iterations run",
                     "actual", "error (vs the estimate for the iterations run)"]
    tasks = re.search(r"<tr><td>tasks.count</td>(.*?)</tr>", table).group(1)
    assert re.findall(r"<td>(.*?)</td>", tasks) == ["715", "78", "78", "+0%"]  # not −89 %
    bars = svgs(page)["Wall time per stage"]
    legend = [t.text for g in bars.iter(f"{SVG}g") if g.get("class") == "legend" for t in g.iter(f"{SVG}text")]
    assert legend == ["estimate before the run", "estimate for the iterations run", "actual"]

    plain = demo_report()
    del plain["estimate_rescaled"], plain["estimate_rescaled_error"]
    table = re.search(r'<table class="estimate">(.*?)</table>', render(plain), flags=re.S).group(1)
    assert re.findall(r"<th>(.*?)</th>", table) == ["figure", "estimate before the run (100 iterations)",
                                                   "actual", "error"]


@pytest.mark.parametrize(("x", "text"), [(7.0654, "7.065"), (2.81174715001897e-09, "2.81 × 10⁻⁹"), (200000.0, "200000"),
                                         (1234567.0, "1.23 × 10⁶"), (0.0, "0"), (0.00012, "1.2 × 10⁻⁴")])
def test_significant(x, text):
    assert significant(x) == text


def test_units():
    assert duration(7.0654) == "7.07 s" and duration(0.0123) == "0.01 s" and duration(125) == "2 min 05 s"
    assert dollars(0) == "$0" and dollars(3.9e-05) == "$0.000039" and dollars(12.345) == "$12.35"
    assert quantity(52800064, "B") == "52.8 MB" and quantity(1234, "count") == "1,234"
    assert nice_ticks(0) == [0.0, 1.0] and nice_ticks(18.5) == [0, 5, 10, 15, 20]
    assert nice_ticks(52.8e6) == [0, 20e6, 40e6, 60e6]
