{{/* The release's object-name prefix: the release name, or fullnameOverride. */}}
{{- define "dualpods.fullname" -}}
{{ .Values.fullnameOverride | default .Release.Name | trunc 40 | trimSuffix "-" }}
{{- end -}}

{{/* The app.kubernetes.io/name label. */}}
{{- define "dualpods.name" -}}
{{ .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The controllers' ServiceAccount; FMA's admission policies and the requesters know it by its suffix. */}}
{{- define "dualpods.serviceAccountName" -}}
{{ .Values.serviceAccount.name | default (printf "%s-fma-controllers" (include "dualpods.fullname" .)) }}
{{- end -}}

{{- define "dualpods.requesterServiceAccountName" -}}
{{ include "dualpods.fullname" . }}-requester
{{- end -}}

{{/* Cluster-scoped names carry the namespace: releases of the same name in two namespaces must not clash. */}}
{{- define "dualpods.clusterName" -}}
{{ .root.Release.Namespace }}-{{ include "dualpods.fullname" .root }}-{{ .suffix }}
{{- end -}}

{{/* An image reference; call with (dict "root" $ "image" VALUES "tag" DEFAULT-TAG). */}}
{{- define "dualpods.imageRef" -}}
{{- $registry := .root.Values.global.imageRegistry | default .image.registry -}}
{{- $repository := ternary (printf "%s/%s" (trimSuffix "/" $registry) .image.repository) .image.repository (ne $registry "") -}}
{{- if .image.digest -}}
{{ $repository }}@{{ .image.digest }}
{{- else -}}
{{ $repository }}:{{ .image.tag | default .tag }}
{{- end -}}
{{- end -}}

{{- define "dualpods.image" -}}
{{ include "dualpods.imageRef" (dict "root" . "image" .Values.image "tag" (.Values.global.imageTag | default .Chart.AppVersion)) }}
{{- end -}}

{{/* The Secret holding the bearer token launchers require; empty when tokens are off. */}}
{{- define "dualpods.launcherTokenSecret" -}}
{{- if .Values.launcherToken.enabled -}}
{{ .Values.launcherToken.existingSecret | default (printf "%s-launcher-token" (include "dualpods.fullname" .)) }}
{{- end -}}
{{- end -}}

{{/* Whether the controllers create the token Secret when it is absent (the chart's own name, not yours). */}}
{{- define "dualpods.createsLauncherToken" -}}
{{- if and .Values.launcherToken.enabled (not .Values.launcherToken.existingSecret) -}}true{{- end -}}
{{- end -}}

{{- define "dualpods.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dualpods.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "dualpods.labels" -}}
{{ include "dualpods.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The Pod-level settings every workload of the chart shares: pull secrets and scheduling. */}}
{{- define "dualpods.podScheduling" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
A controller Deployment; call with (dict "root" $ "name" ... "command" ... "values" ... "args" ...).
Restricted by default (podSecurityContext, securityContext); /tmp is the only writable path.
*/}}
{{- define "dualpods.controller" -}}
{{- $root := .root -}}
{{- $fullname := include "dualpods.fullname" $root -}}
{{- $secret := include "dualpods.launcherTokenSecret" $root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $fullname }}-{{ .name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "dualpods.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .name }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      app.kubernetes.io/component: {{ .name }}
  template:
    metadata:
      labels:
        {{- include "dualpods.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .name }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $root.Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "dualpods.serviceAccountName" $root }}
      terminationGracePeriodSeconds: 10
      {{- with include "dualpods.podScheduling" $root }}
      {{- . | trim | nindent 6 }}
      {{- end }}
      {{- if $root.Values.affinity }}
      affinity:
        {{- toYaml $root.Values.affinity | nindent 8 }}
      {{- else if gt (int .values.replicas) 1 }}
      # Replicas on different Nodes where possible: a lost Node then costs a hand-over, not the controller.
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/instance: {{ $root.Release.Name }}
                    app.kubernetes.io/component: {{ .name }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: controller
          image: {{ include "dualpods.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          args:
            - {{ .command }}
            - --namespace=$(NAMESPACE)
            - --metrics-host=$(POD_IP)
            - --metrics-port={{ .values.metricsPort }}
            - --log-level={{ .values.logLevel }}
            - --num-workers={{ .values.workers }}
            - --kube-api-qps={{ .values.kubeApiQps }}
            - --kube-api-burst={{ .values.kubeApiBurst }}
            {{- if gt (int .values.replicas) 1 }}
            - --leader-elect
            {{- end }}
            {{- if $secret }}
            # Both controllers must build identical launcher Pods, token volume included.
            - --launcher-token-secret={{ $secret }}
            {{- if include "dualpods.createsLauncherToken" $root }}
            - --create-launcher-token-secret
            {{- end }}
            {{- if .mountToken }}
            - --launcher-token-file=/var/run/secrets/dualpods/launcher-token/token
            {{- end }}
            {{- end }}
            {{- with $root.Values.launcherRuntimeClassName }}
            - --launcher-runtime-class={{ . }}
            {{- end }}
            {{- range .args }}
            - {{ . }}
            {{- end }}
            {{- range .values.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: NAMESPACE
              valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
            - name: POD_NAME
              valueFrom: {fieldRef: {fieldPath: metadata.name}}
            # Requester tokens are bound to this Pod: they die with it.
            - name: POD_UID
              valueFrom: {fieldRef: {fieldPath: metadata.uid}}
            {{- with .values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          ports:
            - {name: metrics, containerPort: {{ .values.metricsPort }}}
          # A controller busy with a wave of requesters on a loaded node answers late, not never: a
          # 1 s timeout restarted it mid-wave at 500 requesters on 2 cores (docs/benchmarks.md).
          readinessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 5
            timeoutSeconds: 5
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 20
            timeoutSeconds: 5
          resources:
            {{- toYaml .values.resources | nindent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
            {{- if and $secret .mountToken }}
            - {name: launcher-token, mountPath: /var/run/secrets/dualpods/launcher-token, readOnly: true}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {sizeLimit: 64Mi}
        {{- if and $secret .mountToken }}
        # Optional while the controller creates it at start-up; the kubelet fills the volume once it exists
        # and keeps it in step with the Secret (a rotated token reaches the controller without a restart).
        - name: launcher-token
          secret:
            secretName: {{ $secret }}
            {{- if include "dualpods.createsLauncherToken" $root }}
            optional: true
            {{- end }}
        {{- end }}
{{- end -}}

{{/* A PodDisruptionBudget for a controller with more than one replica; call like dualpods.controller. */}}
{{- define "dualpods.disruptionBudget" -}}
{{- if and .values.enabled (gt (int .values.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "dualpods.fullname" .root }}-{{ .name }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "dualpods.labels" .root | nindent 4 }}
    app.kubernetes.io/component: {{ .name }}
spec:
  maxUnavailable: {{ .root.Values.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ .root.Release.Name }}
      app.kubernetes.io/component: {{ .name }}
{{- end }}
{{- end -}}

{{/* Non-empty when sleeper-aware placement is on: its webhook's configuration is cluster-scoped. */}}
{{- define "dualpods.placement" -}}
{{- if and .Values.placement.enabled .Values.dualPodsController.enabled .Values.rbac.clusterScoped }}true{{ end -}}
{{- end -}}

{{- define "dualpods.placementWebhook" -}}
{{ include "dualpods.clusterName" (dict "root" . "suffix" "placement") }}
{{- end -}}
