from django.urls import path

from access import views

urlpatterns = [
    path("v1/api-keys", views.APIKeyCreateView.as_view(), name="api-keys-create"),
    path("v1/api-keys/rotate", views.APIKeyRotateView.as_view(), name="api-keys-rotate"),
    path("v1/api-keys/emergency-revoke", views.APIKeyEmergencyRevokeView.as_view(), name="api-keys-emergency-revoke"),
    path("v1/api-keys/<str:wallet_id>", views.APIKeyListView.as_view(), name="api-keys-list"),
    path("v1/api-keys/<str:wallet_id>/logs", views.APIKeyLogsView.as_view(), name="api-keys-logs"),
    path("v1/api-keys/<str:wallet_id>/<str:key_id>", views.APIKeyRevokeView.as_view(), name="api-keys-revoke"),
]
