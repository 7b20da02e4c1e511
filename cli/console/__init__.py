"""The controllers' and analysts' console (`dprelease console`): a FastAPI application on uvicorn,
Jinja2 pages and one small script for the passkey ceremonies. It reads the same store, archive and
Prefect API as the command line, signs people in with passkeys (WebAuthn), and hands a controller's
passkey-signed decision to the paused run, which checks it as it checks a key-signed one.

    app.py        the application: pages, routes, roles on every route
    security.py   sessions (cookies), CSRF tokens, roles: who may call what
    enrolment.py  enrolment links and passkey sign-in (the WebAuthn ceremonies)
    deciding.py   the inbox, the decision page, the passkey-signed decision that resumes the run
    history.py    budgets and release histories (per dataset and per series)
    analysts.py   an analyst's requests and published reports
    server.py     serving it (uvicorn), bound to 127.0.0.1 unless told otherwise; the passkeys' site
    commands.py   `dprelease console`, `dprelease analyst add|list`, the enrolment links
    views.py      rendering a page (templates/); states.py: a release's state in words
"""
