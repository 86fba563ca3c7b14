"""One folder per technique (a chart group): its runner composes the measurement loop
(``trials.loop``) and adds what the technique measures on top. ``trials.groups`` declares them.
"""
