from django.urls import path

from receipts import views

urlpatterns = [
    path("v1/receipts", views.ReceiptListView.as_view(), name="receipts"),
    path("v1/receipts/verify", views.ReceiptVerifyView.as_view(), name="receipts-verify"),
    path(
        "v1/receipts/reconciliation/refunds",
        views.RefundReconciliationListView.as_view(),
        name="refund-reconciliation",
    ),
    path(
        "v1/receipts/reconciliation/refunds/<str:receipt_id>/retry",
        views.RefundReconciliationRetryView.as_view(),
        name="refund-reconciliation-retry",
    ),
    path("v1/receipts/permit/<str:permit_id>", views.PermitReceiptListView.as_view(), name="receipts-by-permit"),
    path("v1/receipts/<str:receipt_id>", views.ReceiptDetailView.as_view(), name="receipt-detail"),
    path("v1/receipts/<str:receipt_id>/evidence", views.ReceiptEvidenceView.as_view(), name="receipt-evidence"),
    path("v1/receipts/<str:receipt_id>/portable", views.PortableReceiptView.as_view(), name="receipt-portable"),
    path("v1/evidence/<str:receipt_id>", views.EvidenceBundleView.as_view(), name="evidence"),
    path("v1/permits/<str:permit_id>/receipts", views.PermitReceiptsView.as_view(), name="permit-receipts"),
    path("v1/me/receipts", views.MeReceiptsView.as_view(), name="me-receipts"),
]
