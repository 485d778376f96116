from django.contrib.auth import views as auth_views
from django.urls import path

from access.login_throttle import throttle_failed_logins
from permits import approvals, views

urlpatterns = [
    path("v1/permits", views.PermitCollectionView.as_view(), name="permits"),
    path("v1/permits/verify", views.PermitVerifyView.as_view(), name="permits-verify"),
    path("v1/permits/<str:permit_id>", views.PermitDetailView.as_view(), name="permit-detail"),
    path("v1/permits/<str:permit_id>/revoke", views.PermitRevokeView.as_view(), name="permit-revoke"),
    path("v1/permit-requests", views.PermitRequestCreateView.as_view(), name="permit-requests"),
    path("v1/permit-requests/<str:request_id>", views.PermitRequestDetailView.as_view(), name="permit-request"),
    path(
        "v1/permit-requests/<str:request_id>/card",
        views.PermitRequestCardView.as_view(),
        name="permit-request-card",
    ),
    path("v1/quotes", views.QuoteCreateView.as_view(), name="quotes"),
    path("v1/quotes/<str:quote_id>", views.QuoteDetailView.as_view(), name="quote-detail"),
    path("v1/policies", views.PolicyCollectionView.as_view(), name="policies"),
    path("v1/policies/<str:policy_id>", views.PolicyDetailView.as_view(), name="policy-detail"),
    path("v1/me/authority", views.MeAuthorityView.as_view(), name="me-authority"),
    path("v1/me/permits", views.MePermitsView.as_view(), name="me-permits"),
    path("v1/me/permit-requests", views.MePermitRequestsView.as_view(), name="me-permit-requests"),
    path("v1/me/quotes", views.MeQuotesView.as_view(), name="me-quotes"),
    # Human approval surface (Django session login; API keys cannot reach it).
    path(
        "approvals/login",
        throttle_failed_logins(
            auth_views.LoginView.as_view(template_name="permits/login.html", redirect_authenticated_user=True)
        ),
        name="approvals-login",
    ),
    path("approvals/logout", auth_views.LogoutView.as_view(next_page="/approvals/login"), name="approvals-logout"),
    path("approvals/", approvals.queue, name="approvals-queue"),
    path("approvals/<str:request_id>", approvals.detail, name="approvals-detail"),
    path("approvals/<str:request_id>/decide", approvals.decide, name="approvals-decide"),
]
