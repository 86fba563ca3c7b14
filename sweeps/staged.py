"""Hand Ray Tune the trials that can run now, and the rest as soon as they can: one Tune run whose
trials arrive in stages, each started only while the budget admits it.

A grid fixes every trial before the first starts, but a fresh machine cannot run the zoo's trials
before the zoo is trained. ``StagedSearcher`` gives Tune the first stage's trials in order and asks
``later`` (a callable, polled each time Tune wants a trial) for the next stage's; the moment they
arrive they join the trials not yet started, in ``order`` (the sweep's priority order); until then a
trial that holds every core of its node waits in the queue (the build holds one). Before a trial
is handed out, ``deadline`` (``sweeps.deferral.Deadline``) says whether it can end before the budget
does; one that cannot is deferred to the next run, and the next one in line is asked. When both
stages are given out, the trials the plan deferred (``standby``, in priority order) are offered the
same way: a run whose trials took less than estimated uses the time left on what waits for the next
run. It says FINISHED when nothing is left to offer. A searched group's slot
(``sweeps.searches``) is handed out as what its search proposes. Tune's own loop, resources, retries and callbacks stay as they are.

Once a trial that holds every core of its node is handed out, nothing else is until it completes: Ray
does not grant a waiting request for the whole node before later, smaller ones, so each core a
finishing trial frees would go to the next one-core trial, and the node-holding trial would wait
behind all of them (one sweep ran 25 one-core trials one at a time, each in a fresh worker, while a
server trial waited 6 min). Handed out alone, it starts when the running trials end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from ray.tune.search import Searcher

from sweeps.deferral import holds_node
from trials.config import TrialConfig


class StagedSearcher(Searcher):
    def __init__(self, now: list[TrialConfig], later: Callable[[], list[TrialConfig] | None] | None = None,
                 order: Callable[[list[TrialConfig]], list[TrialConfig]] | None = None, deadline=None,
                 searches=None, standby: list[TrialConfig] = (), on_standby: Callable[[TrialConfig], None] | None = None):
        super().__init__()
        self.searches = searches      # a ``sweeps.searches.Searches``: a searched group's slot runs its proposal
        self.queue = list(now)
        self.standby = list(standby)  # deferred by the plan: offered once the planned trials are given out
        self.on_standby = on_standby  # told of each standby trial handed out
        self.later = later            # None once its trials are queued (or there is no later stage)
        self.order = order or (lambda configs: configs)
        self.deadline = deadline      # None: no budget, every trial starts
        self.holding: str | None = None   # a handed-out trial that holds the node, until it completes

    def suggest(self, trial_id: str) -> dict | None:
        if self.later is not None:
            more = self.later()
            if more is not None:
                self.queue = self.order(self.queue + more)
                self.later = None
            elif not self.queue:
                return None           # not ready yet: Tune asks again
        if self.holding is not None:
            return None               # the node-holding trial waits for the running ones: nothing passes it
        while (config := self._next()) is not None:
            handed = self._hand_out(trial_id, config)
            if handed is not None:
                return handed
        if self.queue:
            return None               # only trials that hold the node, which wait for the zoo's core
        if self.later is not None:
            return None
        while self.standby and self.deadline is not None:
            config = self.standby.pop(0)
            handed = self._hand_out(trial_id, config)
            if handed is not None:
                if self.on_standby is not None:
                    self.on_standby(config)
                return handed
        return Searcher.FINISHED

    def _hand_out(self, trial_id: str, config: TrialConfig) -> dict | None:
        """``config`` as Tune's next trial where the budget admits it (a searched group's slot: what its
        search proposes), else None."""
        if self.deadline is not None and not self.deadline.admits(config):
            return None
        handed = ({"trial": config.to_dict()} if self.searches is None
                  else self.searches.hand_out(trial_id, config, self.deadline))
        if handed is not None and holds_node(config):
            self.holding = trial_id
        return handed

    def _next(self) -> TrialConfig | None:
        """The first queued trial that can start: while the later stage is still being built beside the
        trials (on a core of its own), not one that holds every core of the node: it would wait for that
        core, and nothing is handed out while it waits, so every trial behind it would wait too."""
        for i, config in enumerate(self.queue):
            if self.later is None or not holds_node(config):
                return self.queue.pop(i)
        return None

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """A node-holding trial's end lets the next trials out; a searched trial's result goes to its
        search; a planned one's changes nothing that follows."""
        if trial_id == self.holding:
            self.holding = None
        if self.searches is not None:
            self.searches.complete(trial_id, result, error)

    def save(self, checkpoint_path: str) -> None:
        """What Tune's experiment checkpoint keeps: how many trials were still to be handed out (a
        sweep restarts from the store, which skips finished configs, not from this)."""
        Path(checkpoint_path).write_text(json.dumps({"queued": len(self.queue),
                                                     "later_stage_pending": self.later is not None}))

    def restore(self, checkpoint_path: str) -> None:
        pass
