"""The entry layer: the `dprelease` command line (`app`), the demo, and the terminal side of a
release (`interactive`: start a flow, show the controller its summary, take the decision). It sits
on top of the house and imports downwards only: cli -> flows -> tasks -> dprelease -> dp_core.
"""
