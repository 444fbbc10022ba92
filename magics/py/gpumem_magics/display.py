"""Showing a data dict in the notebook: its text/plain and text/html
renderings (render.py) and the data itself under gpumem's mime type."""

from . import render, state


def show(data):
    """Displays a data dict as text, HTML and gpumem's own mime type."""
    text, html = rendered(data)
    from IPython.display import display

    display({"text/plain": text, "text/html": html, state.MIME: data}, raw=True)


def rendered(data):
    try:
        return render.render(data)
    except Exception as e:
        return render.render({"kind": "error", "message": "rendering failed: %s" % state.short_exc(e)})
