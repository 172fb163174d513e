"""What the book and the exercises show: plotting with Chinese labels, HTML tables, widgets/ and checks/ (the
exercises' checks). Nothing in the library imports this package; notebooks do."""
