from django.urls import path, re_path

from tlog import views

# A tenant id as an origin line may hold it (tollgate_client.tlog.log_origin).
_TENANT = r"(?P<tenant_id>[A-Za-z0-9._:-]{1,40})"

urlpatterns = [
    path(".well-known/tlog-keys", views.LogKeysView.as_view(), name="tlog-keys"),
    re_path(rf"^tlog/{_TENANT}/checkpoint$", views.CheckpointView.as_view(), name="tlog-checkpoint"),
    re_path(rf"^tlog/{_TENANT}/key$", views.LogKeyView.as_view(), name="tlog-key"),
    re_path(
        rf"^tlog/{_TENANT}/proof/(?P<statement_id>[A-Za-z0-9_-]{{1,64}})$", views.ProofView.as_view(), name="tlog-proof"
    ),
    re_path(rf"^tlog/{_TENANT}/consistency$", views.ConsistencyView.as_view(), name="tlog-consistency"),
    re_path(rf"^tlog/{_TENANT}/tile/(?P<path>[0-9A-Za-z./_-]{{1,80}})$", views.TileView.as_view(), name="tlog-tile"),
]
