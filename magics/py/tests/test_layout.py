from gpumem_magics import layout


def test_pad_aligns_all_but_the_last_column():
    lines = layout.pad([["a", "long value", "x"], ["bbb", "v", "last column is not padded"]], ["h1", "h2", "h3"])
    assert lines == [
        "h1   h2          h3",
        "a    long value  x",
        "bbb  v           last column is not padded",
    ]


def test_text_bar():
    assert layout.text_bar(0, 0, 0) == ""
    assert layout.text_bar(50, 100, 100, width=10) == "[█████▒▒▒▒▒]"
    # Any use shows at least one cell, any cache one more.
    assert layout.text_bar(1, 2, 1000, width=10) == "[█▒        ]"
    assert layout.text_bar(200, 100, 100, width=4) == "[████]"


def test_html_escapes():
    html = layout.html_table(["<h>"], [["a&b"], [("html", "<i>trusted</i>")]])
    assert "&lt;h&gt;" in html and "a&amp;b" in html and "<i>trusted</i>" in html
    assert layout.html_lines(["<x>"], "dim") == '<div class="dim">&lt;x&gt;</div>'
