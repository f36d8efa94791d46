"""`/api/v1/skills`: a tenant's skills (its uploads and the platform's), their versions, and exposure."""
import base64
import binascii

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from skills import services
from skills.api import serializers as s
from skills.archives import package_from_upload, package_from_zip
from skills.models import Skill
from skills.packages import PackageProblems
from skills.selectors import groups_by_skill
from tenancy.api.base import TenantScopedViewSet
from tenancy.web import acting_user


class SkillViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    serializer_class = s.SkillSerializer
    model = Skill

    def get_serializer_class(self):
        return s.SkillDetailSerializer if self.action == "retrieve" else s.SkillSerializer

    def safely_get_queryset(self, queryset):
        return queryset.order_by("name")

    def retrieve(self, request, *args, **kwargs):
        skill = self.get_object()
        bound = [group.name for group in groups_by_skill(self.tenant).get(skill.name, [])]
        return Response(s.SkillDetailSerializer(skill, context={"bound_groups": bound}).data)

    @extend_schema(request=s.SkillUploadSerializer, responses={201: s.SkillDetailSerializer})
    def create(self, request):
        """Upload a skill package. A package whose name is the name of one of the tenant's skills is a new
        version of it (unless its files are the same as the newest version's). Nothing is stored unless the
        whole package passes: every problem is listed."""
        upload = s.SkillUploadSerializer(data=request.data)
        upload.is_valid(raise_exception=True)
        try:
            if "archive" in upload.validated_data:
                try:
                    data = base64.b64decode(upload.validated_data["archive"], validate=True)
                except (binascii.Error, ValueError):
                    raise ValidationError({"archive": ["not base64"]}) from None
                package = package_from_zip(data)
            else:
                package = package_from_upload([(path, text.encode("utf-8"))
                                               for path, text in upload.validated_data["files"].items()])
        except PackageProblems as exc:
            raise ValidationError({"package": exc.problems}) from None
        version = services.skill_upload(tenant=self.tenant, package=package, actor=acting_user(request))
        skill = Skill.objects.for_tenant(self.tenant).get(pk=version.skill_id)
        return Response(s.SkillDetailSerializer(skill).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.SkillUpdateSerializer, responses={200: s.SkillSerializer})
    def partial_update(self, request, *args, **kwargs):
        """Switch a skill on or off (a platform skill is off until an operator enables it), or choose the
        agents that see it."""
        skill = self.get_object()
        update = s.SkillUpdateSerializer(data=request.data)
        update.is_valid(raise_exception=True)
        skill = services.skill_update(skill=skill, actor=acting_user(request), **update.validated_data)
        return Response(s.SkillSerializer(skill).data)
