"""The book's concept figures, one module per week's ideas; drawn by
`python -m scripts.tools.draw_figures`."""
