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
]
