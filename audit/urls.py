from django.urls import path

from audit import views

urlpatterns = [
    path("v1/audit/events", views.AuditEventListView.as_view(), name="audit-events"),
    path("v1/audit/summary", views.AuditSummaryView.as_view(), name="audit-summary"),
    path("v1/audit/verify-chain", views.AuditChainVerifyView.as_view(), name="audit-verify-chain"),
    path("v1/me/audit/events", views.MyAuditEventListView.as_view(), name="me-audit-events"),
    path("v1/me/alerts", views.MyAlertListView.as_view(), name="me-alerts"),
    path("v1/signing-keys/active", views.SigningKeyActiveView.as_view(), name="signing-keys-active"),
    path("v1/signing-keys/<str:key_id>", views.SigningKeyDetailView.as_view(), name="signing-keys-detail"),
    path(".well-known/jwks.json", views.JWKSView.as_view(), name="jwks"),
]
