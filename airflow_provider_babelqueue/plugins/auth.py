"""Who may call a plugin route: Airflow's auth manager decides, through the API server's own dependencies.

A FastAPI application mounted by a plugin is not protected by Airflow: nothing checks a token before its
routes run. The checks here are the ones Airflow's REST API uses (``airflow.api_fastapi.core_api.security``):
``get_user`` reads the JWT from the ``Authorization: Bearer`` header or the UI's ``_token`` cookie and asks the
configured auth manager (simple, FAB, Keycloak, ...) who it belongs to; ``requires_access_dag`` asks the same
auth manager whether that user may act on the DAG named in the route. Nothing is reimplemented, so a plugin
page honours exactly the permissions the Airflow UI does, and a token that Airflow refuses is refused here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from fastapi import Depends

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import ResourceMethod

__all__ = ["AUTHENTICATED", "CurrentUser", "DagAccessEntity", "dag_access"]

#: The dependency every route of the plugin's application gets (the application adds it to all of them): a
#: request without a valid Airflow token stops here with 401 (no or expired token) or 403 (invalid token).
AUTHENTICATED = (Depends(get_user),)

#: The signed-in user, for a route that needs to know who asks (e.g. to record who replayed a message).
CurrentUser = GetUserDep


def dag_access(method: ResourceMethod, *entities: DagAccessEntity) -> list[Any]:
    """The route's dependencies: the user may ``method`` the DAG named by the route's ``{dag_id}`` path
    parameter and, for each entity given, that part of it (its runs, task instances, XComs ...); 403 otherwise.

    Use it as ``@router.get("/{dag_id}/...", dependencies=dag_access("GET", DagAccessEntity.RUN))``. The path
    parameter must be called ``dag_id``: that is where Airflow's check reads the DAG from (a route without it
    would be checked against every DAG, as Airflow's own list endpoints are).

    :param method: ``"GET"`` to read; ``"PUT"``/``"POST"``/``"DELETE"`` for routes that change something, so
        that a viewer can read a page but not act on it.
    :param entities: the parts of the DAG the route touches; none means the DAG itself.
    """
    return [Depends(requires_access_dag(method, entity)) for entity in (entities or (None,))]

