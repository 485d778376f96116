from django.urls import path

from billing import views

urlpatterns = [
    path("v1/billing/wallets", views.WalletListView.as_view(), name="billing-wallets-list"),
    path("v1/billing/wallets/sponsor", views.SponsorWalletCreateView.as_view(), name="billing-wallets-sponsor"),
    path("v1/billing/wallets/agent", views.AgentWalletCreateView.as_view(), name="billing-wallets-agent"),
    path("v1/billing/wallets/<str:wallet_id>", views.WalletDetailView.as_view(), name="billing-wallets-detail"),
    path("v1/billing/ledger/<str:wallet_id>", views.LedgerView.as_view(), name="billing-ledger"),
    path("v1/billing/pricing", views.PricingView.as_view(), name="billing-pricing"),
    path("v1/billing/charge", views.ChargeView.as_view(), name="billing-charge"),
    path("v1/api-keys", views.APIKeyCreateView.as_view(), name="api-keys-create"),
    path("v1/api-keys/rotate", views.APIKeyRotateView.as_view(), name="api-keys-rotate"),
    path("v1/api-keys/emergency-revoke", views.APIKeyEmergencyRevokeView.as_view(), name="api-keys-emergency-revoke"),
    path("v1/api-keys/<str:wallet_id>", views.APIKeyListView.as_view(), name="api-keys-list"),
    path("v1/api-keys/<str:wallet_id>/logs", views.APIKeyLogsView.as_view(), name="api-keys-logs"),
    path("v1/api-keys/<str:wallet_id>/<str:key_id>", views.APIKeyRevokeView.as_view(), name="api-keys-revoke"),
]
