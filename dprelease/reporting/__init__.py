"""Reporting: everything a release leaves behind for people to read or check. `pages` renders the
HTML pages (the analyst report, the controller report, the publication index) from jinja2 templates
(the top-level `templates/`, inline CSS and SVG); `data_files` writes the public CSV/JSON; `budget_table` writes a
dataset's budget for people (the UI's budget artifact, `dprelease budget`); `charts` draws the
controller's SVG charts; `signing` signs a release directory (Ed25519 manifest) and verifies one
against a key the reader trusts.
"""
