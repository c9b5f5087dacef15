"""BabelQueueSettleRunOperator: the run started by messages settles them, by how the run went.

With ``BabelQueueMessageTrigger(settle="run_finished")`` a message is not acked when its event is stored: it stays
reserved (for the trigger's ``run_timeout``) and its receipt travels in the event. This operator, the last task of
the DAG (``trigger_rule="all_done"``, so it runs whatever happened upstream), acks the run's messages when every
other task of the run succeeded or was skipped, and otherwise hands them back at once, unchanged: they start a new
run. It needs a broker whose reservation another process can settle (the SQL table, Redis, SQS).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseOperator, Context

from ..hooks import get_hook
from ..triggers.messages import held_receipts

__all__ = ["BabelQueueSettleRunOperator", "run_succeeded"]

#: Task states that count as a success of the run's work.
_DONE = {"success", "skipped"}


def run_succeeded(states: Mapping[str, str | None], own_task_id: str) -> bool:
    """Whether every task of the run but this one ended in success or skipped."""
    return all(str(state) in _DONE for task_id, state in states.items() if task_id != own_task_id)


class BabelQueueSettleRunOperator(BaseOperator):
    """Ack the messages that started this run when the run succeeded; hand them back when it failed.

    Place it last, downstream of the run's work (its default ``trigger_rule`` is ``all_done``). Returns
    ``{"succeeded": bool, "acked": n, "handed_back": n}``.

    :param trigger_rule: ``all_done`` by default, so a failed upstream task still lets it hand the messages back.
    """

    ui_color = "#e8eef8"

    def __init__(self, *, trigger_rule: str = "all_done", **kwargs: Any) -> None:
        super().__init__(trigger_rule=trigger_rule, **kwargs)

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
        succeeded = run_succeeded(states, ti.task_id)
        receipts = held_receipts(context.get("triggering_asset_events"))
        count = sum(len(r) for r in receipts.values())
        for conn_id, held in receipts.items():
            hook = get_hook(conn_id)
            try:
                hook.get_binding().settle_held(held, succeeded=succeeded)
            finally:
                hook.close()
        outcome = {"succeeded": succeeded, "acked": count if succeeded else 0,
                   "handed_back": 0 if succeeded else count}
        self.log.info("%s the %d message(s) that started this run (task states: %s)",
                      "acked" if succeeded else "handed back", count, dict(states))
        return outcome
